# A service whose instances are health-checked by their client (docs/job-files.md, "Checks").
#
#   drover job run deploy/examples/service-checks.nomad.hcl
#   drover service list                          # "web-checked": 1 registration, 1 passing
#   drover service info -verbose web-checked     # each check with its status and output
#
# The client runs both checks for as long as the alloc runs and sends their statuses with
# the alloc; the registration's health is the worse of the two, and nomadService hands out
# only passing instances. An http check failing 3 times in a row (after 10 s of grace from
# the task's start) restarts the task through its restart policy. Needs raw_exec (on in a
# dev agent) and python3 on the node.

job "service-checks" {
  group "web" {
    network {
      port "http" {}
    }

    service {
      name     = "web-checked"
      provider = "nomad"
      port     = "http"

      check {
        name     = "alive"
        type     = "http"
        task     = "server" # the task a group service's check_restart restarts
        path     = "/"
        interval = "2s"
        timeout  = "1s"

        check_restart {
          limit = 3
          grace = "10s"
        }
      }

      check {
        name     = "task-env"
        type     = "script"
        task     = "server" # runs with this task's environment and directory
        command  = "/bin/sh"
        args     = ["-c", "test -n \"$NOMAD_ALLOC_ID\""]
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_http}", "--bind", "${NOMAD_IP_http}"]
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
