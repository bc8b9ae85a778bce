# spread with targets: 70% of the group's allocs on nodes of dc1, the rest anywhere else
# (the share a target list leaves unnamed goes to the other values).
#
#   drover job run deploy/examples/spread-targets.nomad.hcl

job "spread-targets" {
  datacenters = ["*"]

  spread {
    attribute = "${node.datacenter}"
    weight    = 100

    target "dc1" {
      percent = 70
    }
  }

  group "web" {
    count = 3

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
