# user: run a raw_exec task as another OS user (docs/job-files.md, "Task lifecycle").
#
#   drover job run deploy/examples/user.nomad.hcl
#
# Only an agent running as root can switch users; any other agent fails the task at start
# with a task event saying so, instead of running it as the agent's own user.

job "user" {
  type = "batch"

  group "whoami" {
    task "whoami" {
      driver = "raw_exec"
      user   = "nobody"
      config {
        command = "/usr/bin/id"
        args    = ["-un"]
      }
    }
  }
}
