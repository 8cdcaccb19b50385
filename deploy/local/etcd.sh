#!/usr/bin/env bash
# Start, stop or query a local 3-member etcd cluster on 127.0.0.1 (Debian's
# etcd-server, which `deploy/local/setup.sh` installs), for trying the
# replicated rendezvous by hand and for `bench_rendezvous --etcd`:
#
#   deploy/local/etcd.sh start|stop|status|endpoints
#
# `start` returns once a write through etcdctl succeeds and prints the
# members' client addresses (`host:port,host:port,host:port`), which is what
# `kindling-rendezvous --store etcd://<that>/<prefix>` takes; `endpoints`
# prints them again. Idempotent: a cluster that already answers is reused.
#
# Environment:
#   KINDLING_ETCD_PORT  first client port (default 23790); member i listens on
#                       port+i for clients and port+100+i for its peers
#   KINDLING_HOME       the data and logs go to $KINDLING_HOME/etcd (default
#                       ~/.cache/kindling)
set -euo pipefail
home="${KINDLING_HOME:-$HOME/.cache/kindling}"
dir="$home/etcd"
port="${KINDLING_ETCD_PORT:-23790}"
members=3

endpoints() {
  local out=() i
  for ((i = 0; i < members; i++)); do out+=("127.0.0.1:$((port + i))"); done
  local IFS=,
  echo "${out[*]}"
}

healthy() {
  ETCDCTL_API=3 etcdctl --endpoints "$(endpoints)" --command-timeout=2s \
    put /kindling-local/health ok >/dev/null 2>&1
}

start() {
  command -v etcd >/dev/null || { echo "[etcd] etcd not found: deploy/local/setup.sh installs it" >&2; exit 1; }
  if healthy; then endpoints; return; fi
  mkdir -p "$dir"
  local cluster=() i
  for ((i = 0; i < members; i++)); do cluster+=("m$i=http://127.0.0.1:$((port + 100 + i))"); done
  local initial
  initial="$(IFS=,; echo "${cluster[*]}")"
  for ((i = 0; i < members; i++)); do
    local state=new
    [ -d "$dir/m$i/member" ] && state=existing
    nohup etcd --name "m$i" --data-dir "$dir/m$i" \
      --listen-client-urls "http://127.0.0.1:$((port + i))" \
      --advertise-client-urls "http://127.0.0.1:$((port + i))" \
      --listen-peer-urls "http://127.0.0.1:$((port + 100 + i))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((port + 100 + i))" \
      --initial-cluster "$initial" --initial-cluster-state "$state" \
      --initial-cluster-token kindling-local >"$dir/m$i.log" 2>&1 &
    echo $! >"$dir/m$i.pid"
  done
  for _ in $(seq 1 300); do
    if healthy; then endpoints; return; fi
    sleep 0.2
  done
  echo "[etcd] not healthy after 60 s; logs in $dir" >&2
  exit 1
}

stop() {
  local i
  for ((i = 0; i < members; i++)); do
    [ -f "$dir/m$i.pid" ] && kill "$(cat "$dir/m$i.pid")" 2>/dev/null || true
    rm -f "$dir/m$i.pid"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if healthy; then echo "running $(endpoints)"; else echo "stopped"; exit 1; fi ;;
  endpoints) endpoints ;;
  *) echo "usage: $0 start|stop|status|endpoints" >&2; exit 2 ;;
esac
