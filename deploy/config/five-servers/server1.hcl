# drover server 1 of 5 (host 10.0.1.11, zone a): /etc/drover/server.hcl on that host.
# Five voters tolerate two failures; spread them over three failure domains (2 + 2 + 1)
# so that losing any one domain leaves a majority (3). See deploy/RUNBOOK.md.
# The five files differ only in node_name, bind and peers.
node_name = "server1"
data_dir  = "/var/lib/drover/server"

# Listen on this host's address: the raft and gRPC ports bind only this address.
bind      = "10.0.1.11"
grpc_port = 4646
raft_port = 4647

# The OTHER four servers' raft addresses. Every server must list the same five members:
# membership is static (see "Adding or removing a server" in deploy/RUNBOOK.md).
peers = ["10.0.1.12:4647", "10.0.1.13:4647", "10.0.1.14:4647", "10.0.1.15:4647"]

# The same key file on all five servers (deploy/README.md, "The cluster key"): make it
# once with head -c 32 /dev/urandom | base64 > raft.key. A server with peers refuses to
# start without it.
raft_key_file = "/etc/drover/raft.key"

log_json  = true
log_level = "info"
