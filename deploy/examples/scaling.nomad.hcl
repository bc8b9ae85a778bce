# scaling { min, max }: stored and shown by `drover job inspect`; `drover job scale`
# refuses a count outside min..max. The policy is kept for an autoscaler: drover has none.
#
#   drover job run deploy/examples/scaling.nomad.hcl
#   drover job scale scaling web 3     # fine
#   drover job scale scaling web 9     # refused: above max

job "scaling" {
  group "web" {
    count = 1

    scaling {
      min     = 1
      max     = 4
      enabled = true

      policy {
        cooldown = "1m"
      }
    }

    task "sleep" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
