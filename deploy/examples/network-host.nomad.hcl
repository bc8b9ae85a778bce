# network { mode = "host" }: the only mode drover runs (tasks share the node's network);
# "bridge", "cni/*" and `hostname` are refused by name, there are no network namespaces.
#
#   drover job run deploy/examples/network-host.nomad.hcl

job "network-host" {
  group "web" {
    network {
      mode = "host"
      port "http" {}
    }

    task "serve" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
