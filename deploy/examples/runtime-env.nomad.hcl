# What a task sees where it runs: Nomad's NOMAD_* environment and runtime interpolation
# (docs/job-files.md, "Runtime environment").
#
#   drover job run deploy/examples/runtime-env.nomad.hcl
#   drover alloc logs <alloc-id> report
#
# ${node.unique.name}, ${attr.*}, ${meta.*} and ${NOMAD_*} are not HCL: the job file keeps
# them as text and the client fills them in on the node, in the task's config and env, as
# the task starts. A name nothing resolves (${meta.no_such_key}) is left as written.
# Meta is merged job, group, task (the task's wins) and given as NOMAD_META_<key>, both as
# written and upper-cased. Needs raw_exec (on in a dev agent).

job "runtime-env" {
  type = "batch"

  meta {
    owner = "ops"
    tier  = "job"
  }

  group "report" {
    meta {
      tier = "group"
      zone = "z1"
    }

    network {
      port "http" {}
    }

    task "report" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = [
          "-c",
          "echo \"node=$1 index=$2 missing=$3\"; env | grep -E '^(NOMAD_|WHERE=)' | sort",
          "report",
          "${node.unique.name}",
          "${NOMAD_ALLOC_INDEX}",
          "${meta.no_such_key}",
        ]
      }

      env {
        WHERE = "${node.unique.name}:${NOMAD_PORT_http}"
      }

      meta {
        tier = "task"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
