# The job deploy/examples/sdk_example.py runs: two copies of a mock task that run for an
# hour (the dev agent's node has the mock driver), small enough for any node.
job "sdk-example" {
  type        = "service"
  datacenters = ["dc1"]

  group "web" {
    count = 2

    task "app" {
      driver = "mock"

      config {
        run_for = "1h"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
