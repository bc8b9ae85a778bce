# A nightly batch job: one launch at 03:00 Berlin time, never two running at once.
# `drover job periodic force nightly` launches a child now (nightly/periodic-<unix seconds>).
job "nightly" {
  type        = "batch"
  datacenters = ["dc1"]

  periodic {
    crons            = ["0 3 * * *"]
    time_zone        = "Europe/Berlin"
    prohibit_overlap = true
  }

  group "report" {
    task "build" {
      driver = "mock"

      config {
        run_for   = "10s"
        exit_code = 0
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
