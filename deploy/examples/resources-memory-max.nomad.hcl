# resources { memory_max }: the scheduler places on `memory`; `memory_max` is the hard
# limit the task may grow to, given to it as NOMAD_MEMORY_MAX_LIMIT (it must be >= memory).
# `cores = N` instead of `cpu` reserves whole cores (cpu and cores together are refused).
#
#   drover job run deploy/examples/resources-memory-max.nomad.hcl

job "resources-memory-max" {
  type = "batch"

  group "report" {
    task "report" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo memory=$NOMAD_MEMORY_LIMIT memory_max=$NOMAD_MEMORY_MAX_LIMIT"]
      }
      resources {
        cpu        = 50
        memory     = 32
        memory_max = 64
      }
    }
  }
}
