# node_pool: place only on the nodes of one pool (docs: a client's `node_pool` config key,
# "default" when unset; `drover node pool list` shows the pools the nodes are in).
#
#   drover job run deploy/examples/node-pool.nomad.hcl
#
# "all" would place on any node; a pool no node is in leaves the job pending.

job "node-pool" {
  node_pool = "default"

  group "web" {
    task "sleep" {
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
