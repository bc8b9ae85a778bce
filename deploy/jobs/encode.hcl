# A parameterized batch job: nothing runs until it is dispatched. Each dispatch must carry
# a payload and the "file" meta key, and makes one child (encode/dispatch-<unix>-<8 hex>):
#   echo frames | drover job dispatch -meta file=a.mp4 encode -
job "encode" {
  type        = "batch"
  datacenters = ["dc1"]

  parameterized {
    payload       = "required"
    meta_required = ["file"]
  }

  group "encode" {
    task "ffmpeg" {
      driver = "mock"

      config {
        run_for   = "5s"
        exit_code = 0
      }

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
