# Task lifecycle hooks, as Nomad orders them (docs/job-files.md, "Task lifecycle").
#
#   drover job run deploy/examples/lifecycle.nomad.hcl
#
# init (prestart) runs to completion and proxy (prestart sidecar) starts before main;
# announce (poststart) starts once main has started; when main is done the sidecar is
# stopped (only sidecars left); cleanup (poststop) runs once every other task is dead.
# Each task appends its name to order.log in the shared alloc dir. Needs raw_exec (on in
# a dev agent).

job "lifecycle" {
  type = "batch"

  group "app" {
    task "init" {
      driver = "raw_exec"
      lifecycle {
        hook = "prestart"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo init >> \"$NOMAD_ALLOC_DIR/order.log\""]
      }
    }

    task "proxy" {
      driver = "raw_exec"
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          log="$NOMAD_ALLOC_DIR/order.log"
          trap 'echo proxy-stop >> "$log"; exit 0' TERM
          echo proxy-start >> "$log"
          while true; do sleep 0.1; done
        EOT
        ]
      }
    }

    task "main" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo main >> \"$NOMAD_ALLOC_DIR/order.log\"; sleep 1; echo main-done >> \"$NOMAD_ALLOC_DIR/order.log\""]
      }
    }

    task "announce" {
      driver = "raw_exec"
      lifecycle {
        hook = "poststart"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo announce >> \"$NOMAD_ALLOC_DIR/order.log\""]
      }
    }

    task "cleanup" {
      driver = "raw_exec"
      lifecycle {
        hook = "poststop"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo cleanup >> \"$NOMAD_ALLOC_DIR/order.log\""]
      }
    }
  }
}
