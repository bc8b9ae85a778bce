# One copy on every eligible node, each holding the node's port 9100 (an exporter, say).
job "node-exporter" {
  type        = "system"
  datacenters = ["dc1"]

  group "exporter" {
    network {
      port "metrics" {
        static = 9100
      }
    }

    task "exporter" {
      driver = "mock"

      config {
        run_for = "24h"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
