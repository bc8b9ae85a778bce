# drover server 3 of 3 (host 10.0.0.13): /etc/drover/server.hcl on that host.
# The three files differ only in node_name, bind and peers.
node_name = "server3"
data_dir  = "/var/lib/drover/server"

# Listen on this host's address: the raft and gRPC ports bind only this address.
bind      = "10.0.0.13"
grpc_port = 4646
raft_port = 4647

# The OTHER two servers' raft addresses.
peers = ["10.0.0.11:4647", "10.0.0.12:4647"]

# 32 random bytes, base64; the same file on all three servers, mode 0600 or 0640
# (make it once: head -c 32 /dev/urandom | base64 > raft.key; see deploy/README.md).
# Raft traffic is encrypted and authenticated with it; a server with peers refuses to
# start without it.
raft_key_file = "/etc/drover/raft.key"

log_json  = true
log_level = "info"
