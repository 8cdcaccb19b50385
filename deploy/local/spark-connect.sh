#!/usr/bin/env bash
# Start, stop or query a local Spark Connect server (Spark 4 from the pinned
# pyspark wheel) bound to 127.0.0.1. Idempotent: a server that already answers
# on the port is reused. Works from any working directory.
#
#   deploy/local/spark-connect.sh start|stop|status|install|python|executors
#
# `executors` prints one line per live executor JVM of this instance (standalone
# cluster only): `<pid> <node name>`.
#
# Environment:
#   KINDLING_SPARK_PORT   port to bind (default 15002)
#   KINDLING_SPARK_MASTER Spark master (default local[2]; local[2,2] lets a failed
#                         task run again once, as spark.task.maxFailures does on a
#                         cluster — local[N] never retries a task). `standalone`
#                         starts a real standalone cluster first: a master and
#                         KINDLING_SPARK_WORKERS workers on 127.0.0.1 (free ports,
#                         web UIs on free ports, no REST server), each worker
#                         launching its own executor JVM (1 core each), and attaches
#                         the server to it; `start` returns once a query ran on the
#                         executors (on every worker's executor unless dynamic).
#                         The pids (master.pid, worker-<i>.pid, server.pid), logs
#                         and work dirs live in the run dir, $KINDLING_HOME/spark-<port>.
#   Standalone only:
#   KINDLING_SPARK_WORKERS
#                         number of workers (default: the number of entries of
#                         KINDLING_SPARK_NODE_AGENTS when set, else 2)
#   KINDLING_SPARK_NODE_AGENTS
#                         comma-separated agent addresses, one per worker in order:
#                         worker i's executors see KINDLING_AGENT_ADDRESS=<entry i>;
#                         an empty entry (e.g. "grpc://127.0.0.1:7001,") leaves it
#                         unset for that worker. Every worker i's executors see
#                         KINDLING_NODE_NAME=node-<i> regardless.
#   KINDLING_SPARK_EXECUTOR_MEMORY
#                         spark.executor.memory, and each worker's --memory (default 1g)
#   KINDLING_SPARK_TASK_MAX_FAILURES
#                         spark.task.maxFailures (default 4, Spark's own)
#   KINDLING_SPARK_NETNS  nodes in network namespaces: the prefix of nodes made by
#                         `deploy/local/netns.sh up N --prefix <prefix>`. Worker i
#                         runs in namespace <prefix>-node-<i> on that node's address
#                         (its executors and their Python workers with it); the
#                         master and the driver listen on the bridge's address
#                         (<prefix>-br), so executors reach the driver across the
#                         bridge; the Connect server still answers on 127.0.0.1.
#                         Needs root; put each node's agent in its namespace, on its
#                         node address (KINDLING_SPARK_NODE_AGENTS=http://<ip>:<port>,…).
#   KINDLING_SPARK_DYNAMIC
#                         1: dynamic allocation (shuffle tracking, 0..workers
#                         executors, 1 initially, idle executors go after 3 s);
#                         `start` then waits for one executor only
#   KINDLING_SPARK_DAEMON_MEMORY
#                         heap of the master and worker JVMs (default 512m)
#   KINDLING_SPARK_START_TIMEOUT
#                         seconds `start` waits for the server (default 180)
#   KINDLING_SPARK_DRIVER_MEMORY
#                         the server's (driver's) heap (default 4g)
#   KINDLING_SPARK_MAX_RESULT_SIZE
#                         spark.driver.maxResultSize (default 1g, Spark's own):
#                         the most a query's result may hold. Spark Connect sends
#                         a query's whole result through the driver, so a larger
#                         unpersisted DataFrame cannot be relayed in one query;
#                         `fit` relays a persisted one in slices below it.
#   KINDLING_SPARK_UI_PORT
#                         serve Spark's web UI and REST API (jobs, stages and
#                         their CPU time) on 127.0.0.1 at this port (default: no
#                         UI); a local master only
#   KINDLING_SPARK_AUTHENTICATE
#                         1: Spark's own security as the Kubernetes manifests set it
#                         (spark.authenticate, spark.network.crypto.enabled with
#                         AES-GCM and no SASL fallback, spark.io.encryption.enabled);
#                         a local master only, whose secret Spark generates
#   KINDLING_HOME         state dir (default $HOME/.cache/kindling): venv, logs, pid
#   KINDLING_PYTHON       python used to create the venv (default python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="${KINDLING_SPARK_PORT:-15002}"
STATE="${KINDLING_HOME:-$HOME/.cache/kindling}"
VENV="$STATE/venv"
RUN="$STATE/spark-$PORT"
PIDFILE="$RUN/server.pid"
LOG="$RUN/server.log"
PY="${KINDLING_PYTHON:-python3}"
MASTER="${KINDLING_SPARK_MASTER:-local[2]}"
STANDALONE=0; [ "$MASTER" = standalone ] && STANDALONE=1
NODE_AGENTS="${KINDLING_SPARK_NODE_AGENTS-}"
if [ -n "${KINDLING_SPARK_WORKERS:-}" ]; then
  WORKERS="$KINDLING_SPARK_WORKERS"
elif [ -n "${KINDLING_SPARK_NODE_AGENTS+set}" ]; then
  commas="${NODE_AGENTS//[^,]/}"; WORKERS=$(( ${#commas} + 1 ))
else
  WORKERS=2
fi
EXECUTOR_MEMORY="${KINDLING_SPARK_EXECUTOR_MEMORY:-1g}"
DYNAMIC="${KINDLING_SPARK_DYNAMIC:-0}"
NETNS="${KINDLING_SPARK_NETNS:-}"

log() { echo "[spark-connect] $*" >&2; }

install() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    mkdir -p "$STATE"
    "$PY" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c 'import pyspark, pyarrow, grpc, pandas' 2>/dev/null \
     || ! cmp -s "$HERE/requirements.txt" "$VENV/.kindling-requirements"; then
    log "installing $(tr '\n' ' ' < "$HERE/requirements.txt")"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"
    cp "$HERE/requirements.txt" "$VENV/.kindling-requirements"
  fi
  if ! command -v java >/dev/null 2>&1; then
    log "java (17 or newer) is required on PATH"; exit 1
  fi
}

spark_home() {
  "$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

# A real query answered through Spark Connect, not just an open port. With
# SPARK_CONNECT_AUTHENTICATE_TOKEN set (the server then requires it), the
# query carries it: pyspark sends a token without TLS only to `localhost`.
answers() {
  "$VENV/bin/python" - "$PORT" <<'PY' >/dev/null 2>&1
import os, sys
from pyspark.sql import SparkSession
token = os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")
url = f"sc://localhost:{sys.argv[1]}/;token={token}" if token else f"sc://127.0.0.1:{sys.argv[1]}"
s = SparkSession.builder.remote(url).getOrCreate()
assert s.sql("select 1 + 1 as two").collect()[0].two == 2
PY
}

# Standalone cluster -------------------------------------------------------

# Entry $1 (1-based) of KINDLING_SPARK_NODE_AGENTS; empty when absent or empty.
agent_of() {
  [ -n "${KINDLING_SPARK_NODE_AGENTS+set}" ] || return 0
  local list="$NODE_AGENTS," i=1 entry
  while [ -n "$list" ]; do
    entry="${list%%,*}"; list="${list#*,}"
    if [ "$i" -eq "$1" ]; then
      entry="${entry#"${entry%%[![:space:]]*}"}"; printf '%s' "${entry%"${entry##*[![:space:]]}"}"
      return 0
    fi
    i=$((i + 1))
  done
}

# Does process $1 belong to this instance? A JVM whose command line names the
# run dir (work dirs, -Dkindling.run=, spark.local.dir) or that runs in it, or
# any process that inherited a worker's KINDLING_SPARK_RUN (executors and their
# Python workers).
belongs() {
  local p="/proc/$1" args cwd
  [ "$1" != "$$" ] && [ "$1" != "$BASHPID" ] || return 1
  mapfile -d '' -t args <"$p/cmdline" 2>/dev/null || return 1
  [ "${#args[@]}" -gt 0 ] || return 1
  if [ "${args[0]##*/}" = java ]; then
    case " ${args[*]} " in *"$RUN/"*) return 0 ;; esac
    cwd="$(readlink "$p/cwd" 2>/dev/null)" || cwd=""
    case "$cwd/" in "$RUN/"*) return 0 ;; esac
  fi
  grep -qzxF "KINDLING_SPARK_RUN=$RUN" "$p/environ" 2>/dev/null
}

# Pids of this instance's processes; with $1, only those whose command line has $1.
instance_pids() {
  local d pid args
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    if [ -n "${1:-}" ]; then
      mapfile -d '' -t args <"$d/cmdline" 2>/dev/null || continue
      case " ${args[*]} " in *"$1"*) ;; *) continue ;; esac
    fi
    belongs "$pid" && echo "$pid"
  done
  return 0
}

executors() {
  local pid node
  for pid in $(instance_pids CoarseGrainedExecutorBackend); do
    node="$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^KINDLING_NODE_NAME=//p' | head -1)" || true
    if [ -d "/proc/$pid" ]; then echo "$pid ${node:-?}"; fi
  done | sort -k2,2V -k1,1n
}

# Last lines of every log of this instance.
log_tails() {
  local f
  for f in "$LOG" "$RUN/ready.log" "$RUN/master.log" "$RUN"/worker-*.log "$RUN"/worker-*/work/*/*/stderr; do
    [ -f "$f" ] || continue
    log "last lines of $f:"; tail -"${1:-30}" "$f" >&2
  done
}

# A query that runs tasks on the executors: prints the node names that
# answered; succeeds once at least $1 distinct nodes did. A query waits while
# no executor is registered: it gives up at the deadline.
on_executors() {
  local t=$((DEADLINE - SECONDS))
  [ "$t" -lt 1 ] && t=1
  timeout "$t" "$VENV/bin/python" - "$PORT" "$1" "$((2 * WORKERS))" <<'PY' 2>>"$RUN/ready.log"
import sys
from pyspark.sql import SparkSession
port, need, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
def where(batches):
    import os, pyarrow as pa
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict(
        {"pid": [os.getpid()], "node": [os.environ.get("KINDLING_NODE_NAME", "")]})
rows = s.range(0, parts, 1, parts).mapInArrow(where, "pid long, node string").collect()
nodes = sorted({r.node for r in rows if r.node})
print(" ".join(nodes))
sys.exit(0 if len(nodes) >= need else 3)
PY
}

# The IPv4 address of device $2 in namespace $1 (the root namespace when $1
# is empty), without its prefix length.
address_of() {
  local -a ip=(ip)
  [ -z "$1" ] || ip=(ip -n "$1")
  "${ip[@]}" -4 -o addr show dev "$2" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }'
}

# With KINDLING_SPARK_NETNS: HOST_IP (the bridge's address, where the master
# and the driver listen) and NODE_IPS[i] (worker i's namespace address).
netns_addresses() {
  HOST_IP=127.0.0.1
  NODE_IPS=()
  [ -n "$NETNS" ] || return 0
  [ "$(id -u)" -eq 0 ] || { log "KINDLING_SPARK_NETNS: not root (running in a namespace needs root)"; exit 1; }
  HOST_IP="$(address_of "" "$NETNS-br")"
  if [ -z "$HOST_IP" ]; then
    log "KINDLING_SPARK_NETNS=$NETNS: no bridge $NETNS-br with an address (run \`deploy/local/netns.sh up $WORKERS --prefix $NETNS\` first)"
    exit 1
  fi
  local i ip
  for i in $(seq 1 "$WORKERS"); do
    ip="$(address_of "$NETNS-node-$i" eth0)"
    if [ -z "$ip" ]; then
      log "KINDLING_SPARK_NETNS=$NETNS: no namespace $NETNS-node-$i with an address on eth0 for worker $i of $WORKERS"
      exit 1
    fi
    NODE_IPS[i]="$ip"
  done
}

start_cluster() {
  case "$WORKERS" in ''|*[!0-9]*|0) log "KINDLING_SPARK_WORKERS must be a positive number, got '$WORKERS'"; exit 2 ;; esac
  if [ -n "${KINDLING_SPARK_NODE_AGENTS+set}" ]; then
    local commas="${NODE_AGENTS//[^,]/}"
    if [ $(( ${#commas} + 1 )) -ne "$WORKERS" ]; then
      log "KINDLING_SPARK_NODE_AGENTS has $(( ${#commas} + 1 )) entries for $WORKERS workers"; exit 2
    fi
  fi
  # Leftovers of an earlier cluster on this port whose server is gone.
  local f
  for f in "$RUN"/worker-*.pid "$RUN/master.pid"; do
    if [ -f "$f" ]; then stop_pidfile "$f" || true; fi
  done
  rm -rf "$RUN"/worker-* "$RUN/master.log" "$RUN/master.url" "$RUN/ready.log" "$RUN/ready.out"
  netns_addresses
  export SPARK_LOCAL_IP="$HOST_IP"
  export SPARK_DAEMON_MEMORY="${KINDLING_SPARK_DAEMON_MEMORY:-512m}"
  SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false -Dkindling.run=$RUN/" \
    nohup "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
      --host "$HOST_IP" --port 0 --webui-port 0 >"$RUN/master.log" 2>&1 9>&- &
  echo $! >"$RUN/master.pid"
  local url=""
  until url="$(grep -o 'Starting Spark master at spark://[^ ]*' "$RUN/master.log" 2>/dev/null | head -1)" && [ -n "$url" ]; do
    if ! kill -0 "$(cat "$RUN/master.pid")" 2>/dev/null; then
      log "master exited during start-up"; log_tails; exit 1
    fi
    if [ $SECONDS -ge "$DEADLINE" ]; then
      log "master did not start within the start timeout"; log_tails; exit 1
    fi
    sleep 1
  done
  MASTER_URL="${url##* }"
  echo "$MASTER_URL" >"$RUN/master.url"
  local i dir agent host
  local -a netns=()
  for i in $(seq 1 "$WORKERS"); do
    dir="$RUN/worker-$i"
    mkdir -p "$dir/work" "$dir/local"
    agent="$(agent_of "$i")"
    host=127.0.0.1
    netns=()
    if [ -n "$NETNS" ]; then
      host="${NODE_IPS[i]}"
      netns=(ip netns exec "$NETNS-node-$i")
    fi
    # Executors inherit the worker's environment (KINDLING_SPARK_RUN marks
    # them, and their Python workers, as this instance's for `stop`).
    local -a env_args=(-u KINDLING_AGENT_ADDRESS
      "KINDLING_NODE_NAME=node-$i" "KINDLING_SPARK_RUN=$RUN"
      "SPARK_LOCAL_IP=$host" "SPARK_LOCAL_DIRS=$dir/local" "SPARK_WORKER_OPTS=-Dkindling.run=$RUN/")
    if [ -n "$agent" ]; then env_args+=("KINDLING_AGENT_ADDRESS=$agent"); fi
    nohup "${netns[@]}" env "${env_args[@]}" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host "$host" --port 0 --webui-port 0 --cores 1 --memory "$EXECUTOR_MEMORY" \
      --work-dir "$dir/work" "$MASTER_URL" >"$RUN/worker-$i.log" 2>&1 9>&- &
    echo $! >"$RUN/worker-$i.pid"
  done
  if [ -n "$NETNS" ]; then
    log "standalone master $MASTER_URL on bridge $NETNS-br, $WORKERS workers in namespaces $NETNS-node-1..$WORKERS (${NODE_IPS[*]}) (run dir $RUN)"
  else
    log "standalone master $MASTER_URL, $WORKERS workers (run dir $RUN)"
  fi
}

# Kills the process in pid file $1 (TERM, then KILL after 30 s).
stop_pidfile() {
  local pid; pid="$(cat "$1" 2>/dev/null)" || return 1
  rm -f "$1"
  kill -0 "$pid" 2>/dev/null || return 1
  log "stopping $(basename "$1" .pid) pid $pid"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

# Server ---------------------------------------------------------------------

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

start() {
  if [ -n "$NETNS" ] && [ "$STANDALONE" != 1 ]; then
    log "KINDLING_SPARK_NETNS needs KINDLING_SPARK_MASTER=standalone"; exit 2
  fi
  mkdir -p "$STATE"
  if [ -x "$VENV/bin/python" ] && port_open && answers; then
    log "already running on 127.0.0.1:$PORT"
    return 0
  fi
  # Concurrent callers (parallel test processes) wait for one start.
  exec 9>"$STATE/spark-$PORT.lock"
  flock 9
  install
  if port_open && answers; then
    log "already running on 127.0.0.1:$PORT"
    return 0
  fi
  mkdir -p "$RUN"
  local started=$SECONDS
  DEADLINE=$((SECONDS + ${KINDLING_SPARK_START_TIMEOUT:-180}))
  export SPARK_HOME; SPARK_HOME="$(spark_home)"
  export PYSPARK_PYTHON="$VENV/bin/python"
  export SPARK_LOG_DIR="$RUN/logs" SPARK_PID_DIR="$RUN"
  export SPARK_IDENT_STRING="kindling-$PORT"
  local master="$MASTER"
  local -a cluster=()
  if [ "$STANDALONE" = 1 ]; then
    start_cluster
    master="$MASTER_URL"
    cluster=(
      --conf "spark.driver.host=$HOST_IP"
      --conf "spark.driver.bindAddress=$HOST_IP"
      --conf spark.executor.cores=1
      --conf "spark.executor.memory=$EXECUTOR_MEMORY"
      --conf "spark.task.maxFailures=${KINDLING_SPARK_TASK_MAX_FAILURES:-4}"
      --conf "spark.pyspark.python=$VENV/bin/python"
      --conf "spark.executorEnv.PYSPARK_PYTHON=$VENV/bin/python"
      --conf "spark.executor.extraJavaOptions=-Dkindling.run=$RUN/"
    )
    if [ "$DYNAMIC" = 1 ]; then
      cluster+=(
        --conf spark.dynamicAllocation.enabled=true
        --conf spark.dynamicAllocation.shuffleTracking.enabled=true
        --conf spark.dynamicAllocation.minExecutors=0
        --conf spark.dynamicAllocation.initialExecutors=1
        --conf "spark.dynamicAllocation.maxExecutors=$WORKERS"
        --conf spark.dynamicAllocation.executorIdleTimeout=3s
        --conf spark.dynamicAllocation.cachedExecutorIdleTimeout=5s
        --conf spark.dynamicAllocation.shuffleTracking.timeout=10s
        --conf spark.dynamicAllocation.schedulerBacklogTimeout=1s
      )
    fi
  fi
  local -a wire=()
  if [ "${KINDLING_SPARK_AUTHENTICATE:-0}" = 1 ]; then
    if [ "$STANDALONE" = 1 ]; then
      log "KINDLING_SPARK_AUTHENTICATE applies to a local master only"; exit 1
    fi
    wire+=(--conf spark.authenticate=true
           --conf spark.network.crypto.enabled=true
           --conf spark.network.crypto.cipher=AES/GCM/NoPadding
           --conf spark.network.crypto.authEngineVersion=2
           --conf spark.network.crypto.saslFallback=false
           --conf spark.io.encryption.enabled=true)
  fi
  local ui=(--conf spark.ui.enabled=false)
  if [ -n "${KINDLING_SPARK_UI_PORT:-}" ]; then
    if [ "$STANDALONE" = 1 ]; then
      log "KINDLING_SPARK_UI_PORT applies to a local master only"; exit 1
    fi
    # The UI listens where the driver does: on loopback.
    export SPARK_LOCAL_IP=127.0.0.1
    ui=(--conf spark.ui.enabled=true --conf "spark.ui.port=$KINDLING_SPARK_UI_PORT"
        --conf spark.ui.retainedJobs=100000
        --conf spark.ui.retainedStages=100000)
  fi
  log "starting Spark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)') ($master) on 127.0.0.1:$PORT"
  # Run in the foreground under nohup so the pid we record is the JVM's.
  nohup "$SPARK_HOME/bin/spark-submit" \
    --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --name "kindling-connect-$PORT" \
    --master "$master" \
    --driver-memory "${KINDLING_SPARK_DRIVER_MEMORY:-4g}" \
    --conf spark.connect.grpc.binding.address=127.0.0.1 \
    --conf "spark.connect.grpc.binding.port=$PORT" \
    --conf spark.connect.grpc.maxInboundMessageSize=268435456 \
    --conf "spark.driver.maxResultSize=${KINDLING_SPARK_MAX_RESULT_SIZE:-1g}" \
    "${ui[@]}" \
    --conf spark.sql.shuffle.partitions=4 \
    --conf "spark.local.dir=$RUN/tmp" \
    --conf "spark.sql.warehouse.dir=$RUN/warehouse" \
    --conf "spark.driver.extraJavaOptions=-Dderby.system.home=$RUN/derby" \
    "${cluster[@]}" \
    "${wire[@]}" \
    spark-internal >"$LOG" 2>&1 9>&- &
  echo $! >"$PIDFILE"
  if [ "$STANDALONE" = 1 ]; then
    # Every worker's executor answers (one with dynamic allocation, which
    # starts with one), so tests see all nodes from the first query on.
    # The query runs in the background while this loop watches the JVMs.
    local need="$WORKERS" nodes="" f attempt="" out="$RUN/ready.out"
    [ "$DYNAMIC" = 1 ] && need=1
    while :; do
      if [ -z "$attempt" ] && port_open; then
        on_executors "$need" >"$out" 9>&- &
        attempt=$!
      fi
      if [ -n "$attempt" ] && ! kill -0 "$attempt" 2>/dev/null; then
        if wait "$attempt"; then nodes="$(cat "$out")"; break; fi
        nodes="$(cat "$out")"; attempt=""
      fi
      for f in "$PIDFILE" "$RUN/master.pid" "$RUN"/worker-*.pid; do
        if ! kill -0 "$(cat "$f")" 2>/dev/null; then
          [ -n "$attempt" ] && kill "$attempt" 2>/dev/null
          log "$(basename "$f" .pid) exited during start-up"; log_tails; exit 1
        fi
      done
      if [ $SECONDS -ge "$DEADLINE" ]; then
        [ -n "$attempt" ] && kill "$attempt" 2>/dev/null
        log "no query ran on $need executor(s) within the start timeout${nodes:+ (only on $nodes)}"
        log_tails; exit 1
      fi
      sleep 1
    done
    log "ready: sc://127.0.0.1:$PORT on $MASTER_URL, tasks ran on $nodes in $((SECONDS - started)) s (server pid $(cat "$PIDFILE"), log $LOG)"
    return 0
  fi
  until port_open && answers; do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "server exited during start-up; last lines of $LOG:"; tail -30 "$LOG" >&2; exit 1
    fi
    if [ $SECONDS -ge "$DEADLINE" ]; then
      log "server did not answer within the start timeout; see $LOG"; exit 1
    fi
    sleep 1
  done
  log "ready: sc://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
}

stop() {
  local stopped=0 f pid
  # The server first (its executors go with the application), then the
  # workers (they kill their executors), then the master.
  for f in "$PIDFILE" "$RUN"/worker-*.pid "$RUN/master.pid"; do
    if [ -f "$f" ] && stop_pidfile "$f"; then stopped=1; fi
  done
  # Whatever of this instance outlived them (an executor of a worker that was
  # SIGKILLed, its Python workers): TERM, then KILL.
  local left; left="$(instance_pids | tr '\n' ' ')"
  if [ -n "${left// /}" ]; then
    log "stopping leftovers of $RUN: $left"
    # shellcheck disable=SC2086
    kill $left 2>/dev/null || true
    for _ in $(seq 1 20); do
      left="$(for pid in $left; do if kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi; done | tr '\n' ' ')"
      [ -z "${left// /}" ] && break
      sleep 0.5
    done
    # shellcheck disable=SC2086
    if [ -n "${left// /}" ]; then kill -9 $left 2>/dev/null || true; fi
    stopped=1
  fi
  left="$(instance_pids CoarseGrainedExecutorBackend | tr '\n' ' ')"
  if [ -n "${left// /}" ]; then
    log "executor JVMs of $RUN survived: $left"; return 1
  fi
  [ "$stopped" = 1 ] || log "no server started by this script on port $PORT"
}

status() {
  if port_open && answers; then echo "running sc://127.0.0.1:$PORT"; else echo "stopped"; return 1; fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  install) install ;;
  python) echo "$VENV/bin/python" ;;
  executors) executors ;;
  *) echo "usage: $0 start|stop|status|install|python|executors" >&2; exit 2 ;;
esac
