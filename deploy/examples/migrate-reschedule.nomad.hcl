# migrate and reschedule at the job level: every group without its own block inherits
# them, and a group's own block is laid over the job's (as Nomad merges them).
#
#   drover job run deploy/examples/migrate-reschedule.nomad.hcl

job "migrate-reschedule" {
  migrate {
    max_parallel     = 1
    health_check     = "task_states"
    min_healthy_time = "5s"
    healthy_deadline = "1m"
  }

  reschedule {
    attempts       = 3
    interval       = "1h"
    delay          = "10s"
    delay_function = "constant"
    unlimited      = false
  }

  group "web" {
    count = 2

    # Only the delay differs from the job's policy; attempts and interval are the job's.
    reschedule {
      delay = "5s"
    }

    task "sleep" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
