# A long-running service: three copies of a mock task, each with a dynamic "http" port.
job "demo" {
  type        = "service"
  datacenters = ["dc1"]

  group "web" {
    count = 3

    network {
      port "http" {}
    }

    task "server" {
      driver = "mock"

      config {
        run_for = "1h"
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
