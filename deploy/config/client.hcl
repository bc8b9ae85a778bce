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

# raw_exec runs a job's command as this agent's user (drover-client.service: drover),
# unisolated: anyone who can submit a job runs code on this node. Off unless set, as in
# Nomad; turn it on only where every job submitter is trusted (ACLs: docs/SECURITY.md).
enable_raw_exec = false

log_json  = true
log_level = "info"
