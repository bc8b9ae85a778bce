# A service registered with drover's own service discovery (docs/job-files.md, "Services").
#
#   drover job run deploy/examples/service-api.nomad.hcl
#   drover service list
#   drover service info api-http
#
# The registration exists while the alloc runs: the servers write it in the same raft
# entry that records the alloc running, and remove it in the one that stops it.
# service-consumer.nomad.hcl reads it from a template. Needs raw_exec (on in a dev agent).

job "service-api" {
  group "api" {
    network {
      port "http" {}
    }

    service {
      name     = "api-http"
      provider = "nomad"
      port     = "http"
      tags     = ["v1", "public"]
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
