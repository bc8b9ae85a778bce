# max_client_disconnect and stop_after_client_disconnect: Nomad's older names for
# disconnect { lost_after } and disconnect { stop_on_client_after }. Setting an old name
# beside a disconnect block is refused (which one would win?).
#
#   drover job run deploy/examples/disconnect-aliases.nomad.hcl

job "disconnect-aliases" {
  group "web" {
    max_client_disconnect = "1h"

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
