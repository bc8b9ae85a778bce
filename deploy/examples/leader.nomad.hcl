# leader = true: when the leader task exits, the group's other tasks are stopped
# (docs/job-files.md, "Task lifecycle").
#
#   drover job run deploy/examples/leader.nomad.hcl
#
# The worker would run for ever; once the leader is done, the worker is stopped the way
# its own keys say: shutdown_delay first, then kill_signal (SIGINT here), then SIGKILL
# after kill_timeout. The alloc ends complete: a task stopped by its leader did not fail.
# Needs raw_exec (on in a dev agent).

job "leader" {
  type = "batch"

  group "pair" {
    task "leader" {
      driver = "raw_exec"
      leader = true
      config {
        command = "/bin/sh"
        args    = ["-c", "sleep 1; echo leader-done >> \"$NOMAD_ALLOC_DIR/order.log\""]
      }
    }

    task "worker" {
      driver         = "raw_exec"
      kill_signal    = "SIGINT"
      shutdown_delay = "1s"
      kill_timeout   = "10s"
      config {
        command = "/bin/sh"
        args = ["-c", <<-EOT
          log="$NOMAD_ALLOC_DIR/order.log"
          trap 'echo worker-got-INT >> "$log"; exit 0' INT
          trap 'echo worker-got-TERM >> "$log"; exit 0' TERM
          echo worker-start >> "$log"
          while true; do sleep 0.1; done
        EOT
        ]
      }
    }
  }
}
