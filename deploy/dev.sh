#!/usr/bin/env bash
# `make dev`: one `drover agent -dev` (server and client in one process), the demo job
# submitted to it, and the agent kept in the foreground until Ctrl-C.
#
# Environment: DEV_GRPC_PORT (default 4646), DEV_HTTP_PORT (metrics and health, default
# 4649), DEV_DATA_DIR (default: a temporary directory the agent removes on exit),
# DEV_READY_TIMEOUT seconds (default 60).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

drover=.venv/bin/drover
port=${DEV_GRPC_PORT:-4646}
http_port=${DEV_HTTP_PORT:-4649}
ready_timeout=${DEV_READY_TIMEOUT:-60}
export DROVER_ADDR=127.0.0.1:$port

if [[ ! -x $drover ]]; then
    echo "dev: $drover not found; run 'make install' first" >&2
    exit 1
fi

if "$drover" operator raft list-peers -retry-deadline 1 >/dev/null 2>&1; then
    echo "dev: something already answers on $DROVER_ADDR; stop it or set DEV_GRPC_PORT" >&2
    exit 1
fi

args=(agent -dev -grpc-port "$port" -http-port "$http_port")
if [[ -n ${DEV_DATA_DIR:-} ]]; then
    args+=(-data-dir "$DEV_DATA_DIR")
fi

"$drover" "${args[@]}" &
agent=$!

# The agent stops cleanly on SIGTERM; wait for it so its last log lines come out before
# the prompt returns. Runs on Ctrl-C, on `kill` of this script, and on any early exit.
stop_agent() {
    trap - INT TERM EXIT
    if kill -0 "$agent" 2>/dev/null; then
        echo "dev: stopping the agent (pid $agent)" >&2
        kill -TERM "$agent" 2>/dev/null || true
        wait "$agent" 2>/dev/null || true
    fi
}
trap 'stop_agent; exit 130' INT
trap 'stop_agent; exit 143' TERM
trap stop_agent EXIT

deadline=$((SECONDS + ready_timeout))
until "$drover" operator raft list-peers -retry-deadline 1 >/dev/null 2>&1; do
    if ! kill -0 "$agent" 2>/dev/null; then
        wait "$agent" && rc=0 || rc=$?
        echo "dev: the agent exited (status $rc) before it answered on $DROVER_ADDR" >&2
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        echo "dev: the agent did not answer on $DROVER_ADDR within ${ready_timeout}s" >&2
        exit 1
    fi
    sleep 0.2
done

# The embedded client registers its node right after the server is up.
until "$drover" node status -retry-deadline 1 2>/dev/null | grep -q " ready"; do
    if ((SECONDS >= deadline)); then
        echo "dev: the embedded client did not register within ${ready_timeout}s" >&2
        exit 1
    fi
    sleep 0.2
done

# Register the demo job and follow its evaluation as the scheduler places it.
"$drover" job run -monitor-timeout 30 deploy/jobs/demo.hcl || echo "dev: 'drover job run' failed (see above)" >&2
echo
"$drover" job status demo || echo "dev: 'drover job status demo' failed (see above)" >&2

cat <<EOF

drover dev agent is running on $DROVER_ADDR (pid $agent).
  export DROVER_ADDR=$DROVER_ADDR
  .venv/bin/drover job status demo
  .venv/bin/drover operator raft list-peers
  curl -s 'http://127.0.0.1:$http_port/v1/metrics?format=prometheus' | grep ^drover_
Press Ctrl-C to stop it.
EOF

# `wait` returns early when a trapped signal arrives; the trap then stops the agent.
wait "$agent" && rc=0 || rc=$?
trap - INT TERM EXIT
echo "dev: the agent exited with status $rc" >&2
exit "$rc"
