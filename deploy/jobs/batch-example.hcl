# Two copies of a short job that runs for five seconds and exits cleanly.
job "batch-example" {
  type        = "batch"
  datacenters = ["dc1"]

  group "work" {
    count = 2

    task "crunch" {
      driver = "mock"

      config {
        run_for   = "5s"
        exit_code = 0
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
