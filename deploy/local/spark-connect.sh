#!/usr/bin/env bash
# Start, stop or query a local Spark Connect server (Spark 4 from the pinned
# pyspark wheel) bound to 127.0.0.1. Idempotent: a server that already answers
# on the port is reused. Works from any working directory.
#
#   deploy/local/spark-connect.sh start|stop|status|install
#
# Environment:
#   KINDLING_SPARK_PORT   port to bind (default 15002)
#   KINDLING_SPARK_MASTER Spark master (default local[2]; local[2,2] lets a failed
#                         task run again once, as spark.task.maxFailures does on a
#                         cluster — local[N] never retries a task)
#   KINDLING_SPARK_MAX_RESULT_SIZE
#                         spark.driver.maxResultSize (default 1g, Spark's own):
#                         the most a query's result may hold. Spark Connect sends
#                         a query's whole result through the driver, so a larger
#                         unpersisted DataFrame cannot be relayed in one query;
#                         `fit` relays a persisted one in slices below it.
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

# A real query answered through Spark Connect, not just an open port.
answers() {
  "$VENV/bin/python" - "$PORT" <<'PY' >/dev/null 2>&1
import sys
from pyspark.sql import SparkSession
s = SparkSession.builder.remote(f"sc://127.0.0.1:{sys.argv[1]}").getOrCreate()
assert s.sql("select 1 + 1 as two").collect()[0].two == 2
PY
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

start() {
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
  export SPARK_HOME; SPARK_HOME="$(spark_home)"
  export PYSPARK_PYTHON="$VENV/bin/python"
  export SPARK_LOG_DIR="$RUN/logs" SPARK_PID_DIR="$RUN"
  export SPARK_IDENT_STRING="kindling-$PORT"
  log "starting Spark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)') ($MASTER) on 127.0.0.1:$PORT"
  # Run in the foreground under nohup so the pid we record is the JVM's.
  nohup "$SPARK_HOME/bin/spark-submit" \
    --class org.apache.spark.sql.connect.service.SparkConnectServer \
    --name "kindling-connect-$PORT" \
    --master "$MASTER" \
    --driver-memory "${KINDLING_SPARK_DRIVER_MEMORY:-4g}" \
    --conf spark.connect.grpc.binding.address=127.0.0.1 \
    --conf "spark.connect.grpc.binding.port=$PORT" \
    --conf spark.connect.grpc.maxInboundMessageSize=268435456 \
    --conf "spark.driver.maxResultSize=${KINDLING_SPARK_MAX_RESULT_SIZE:-1g}" \
    --conf spark.ui.enabled=false \
    --conf spark.sql.shuffle.partitions=4 \
    --conf "spark.local.dir=$RUN/tmp" \
    --conf "spark.sql.warehouse.dir=$RUN/warehouse" \
    --conf "spark.driver.extraJavaOptions=-Dderby.system.home=$RUN/derby" \
    spark-internal >"$LOG" 2>&1 9>&- &
  echo $! >"$PIDFILE"
  local deadline=$((SECONDS + ${KINDLING_SPARK_START_TIMEOUT:-180}))
  until port_open && answers; do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "server exited during start-up; last lines of $LOG:"; tail -30 "$LOG" >&2; exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      log "server did not answer within the start timeout; see $LOG"; exit 1
    fi
    sleep 1
  done
  log "ready: sc://127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
}

stop() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    local pid; pid="$(cat "$PIDFILE")"
    log "stopping pid $pid"
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
  else
    log "no server started by this script on port $PORT"
  fi
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
  *) echo "usage: $0 start|stop|status|install|python" >&2; exit 2 ;;
esac
