# drover client: /etc/drover/client.hcl on every node that runs work.
# node_name must be unique per node (e.g. the host name).
node_name = "client1"
data_dir  = "/var/lib/drover/client"

# The servers' gRPC addresses; the client fails over between them.
servers = ["10.0.0.11:4646", "10.0.0.12:4646", "10.0.0.13:4646"]

datacenter = "dc1"
node_class = "general"
meta = {
  rack = "r1"
}

log_json  = true
log_level = "info"
