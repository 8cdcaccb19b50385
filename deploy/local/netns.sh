#!/usr/bin/env bash
# Nodes in network namespaces: each "node" is a network namespace with its own
# address on a bridge in the root namespace, optionally behind `tc netem`
# bandwidth and latency, so traffic between processes on different nodes
# crosses real interfaces and "the agent on my node" is decided by address,
# as on Kubernetes. Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), `ip` and
# `tc` (iproute2), and the veth, bridge and sch_netem kernel features.
#
#   deploy/local/netns.sh up N [--prefix NAME] [--subnet A.B.C] [--rate RATE]
#                             [--delay DELAY] [--netem-on node|host|both]
#                             [--if-no-netem fail|tbf]
#       Creates bridge <prefix>-br with <subnet>.1/24 in the root namespace
#       and N namespaces <prefix>-node-<i> (i = 1..N), each with `lo` up and
#       `eth0` (one end of a veth pair; the other end, <prefix>-h<i>, is on the
#       bridge) at <subnet>.(10+i)/24, default route via <subnet>.1. With
#       --rate and/or --delay (tc syntax: 500mbit, 2ms) a netem qdisc shapes
#       what leaves each node's eth0 (`node`, the default), what the bridge
#       sends into each node (`host`, on <prefix>-h<i>), or both (then a packet
#       between two nodes is delayed twice). A kernel without netem
#       (CONFIG_NET_SCH_NETEM) fails `up`, unless --if-no-netem tbf: then the
#       rate is shaped with a token bucket (tbf) and the delay left out, with
#       a warning on stderr. Refuses if anything named
#       <prefix>-... exists or <subnet>.0/24 is already on an interface; if it
#       fails (or is interrupted) midway it removes what it created. Prints one
#       line per node: `<namespace> <ip>`.
#   deploy/local/netns.sh down [--prefix NAME]
#       Deletes every namespace and link named <prefix>-...; succeeds when
#       there is nothing to delete. Processes still running in a namespace
#       keep running (without a network once their veth is gone): stop them
#       first.
#   deploy/local/netns.sh exec I [--prefix NAME] -- CMD [ARG...]
#       Runs CMD in node I's namespace (`ip netns exec`, which execs CMD: the
#       process that ran this script becomes CMD, so its pid can be signalled).
#   deploy/local/netns.sh check [--netem]
#       Exits 0 if namespaces can be made here: creates a throwaway namespace
#       with a veth pair into it (and, with --netem, a netem qdisc on it) and
#       removes it. Otherwise prints why on stderr and exits 3; the reason
#       starts with `not root` when that is the cause.
#
# Interface names are at most 15 characters: the prefix is letters and digits,
# starting with a letter, short enough for <prefix>-h<N> (at most 12 with 1-9
# nodes, 11 with 10-99, 10 with 100-244).
#
# Environment (flags win):
#   KINDLING_NETNS_PREFIX  prefix of every name (default kn)
#   KINDLING_NETNS_SUBNET  first three octets of the /24 (default 10.77.0)
#
# Exit status: 0 ok, 1 failure, 2 usage error, 3 (`check`) namespaces unavailable.
set -euo pipefail

PROG="netns.sh"
PREFIX="${KINDLING_NETNS_PREFIX:-kn}"
SUBNET="${KINDLING_NETNS_SUBNET:-10.77.0}"
RATE=""
DELAY=""
NETEM_ON="node"
NETEM_CHECK=0
IF_NO_NETEM="fail"
COUNT=""
NODE=""
CMD=()

log() { echo "$PROG: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { log "$*"; log "usage: see the header of ${BASH_SOURCE[0]}"; exit 2; }

# Parses the flags of every verb into the globals above; positional
# arguments go to COUNT (`up`) or NODE (`exec`); `--` ends them for `exec`.
parse() {
  local verb="$1"
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --prefix) [ $# -ge 2 ] || usage "--prefix needs a value"; PREFIX="$2"; shift 2 ;;
      --subnet) [ $# -ge 2 ] || usage "--subnet needs a value"; SUBNET="$2"; shift 2 ;;
      --rate) [ $# -ge 2 ] || usage "--rate needs a value"; RATE="$2"; shift 2 ;;
      --delay) [ $# -ge 2 ] || usage "--delay needs a value"; DELAY="$2"; shift 2 ;;
      --netem-on) [ $# -ge 2 ] || usage "--netem-on needs a value"; NETEM_ON="$2"; shift 2 ;;
      --if-no-netem) [ $# -ge 2 ] || usage "--if-no-netem needs a value"; IF_NO_NETEM="$2"; shift 2 ;;
      --netem) NETEM_CHECK=1; shift ;;
      --)
        [ "$verb" = exec ] || usage "unexpected --"
        shift
        CMD=("$@")
        break
        ;;
      -*) usage "unknown option $1" ;;
      *)
        case "$verb" in
          up) [ -z "$COUNT" ] || usage "unexpected argument $1"; COUNT="$1" ;;
          exec) [ -z "$NODE" ] || usage "unexpected argument $1 (put the command after --)"; NODE="$1" ;;
          *) usage "unexpected argument $1" ;;
        esac
        shift
        ;;
    esac
  done
  [[ "$PREFIX" =~ ^[a-z][a-z0-9]*$ ]] || usage "--prefix must be letters and digits, starting with a letter: $PREFIX"
  [ ${#PREFIX} -le 12 ] || usage "--prefix $PREFIX is longer than 12 characters (interface names are at most 15)"
}

require_root() {
  [ "$(id -u)" -eq 0 ] || die "not root: creating namespaces and links needs root"
  command -v ip >/dev/null || die "no \`ip\` command (iproute2)"
}

# Namespaces named <prefix>-..., one a line.
namespaces() {
  ip netns list 2>/dev/null | awk -v p="$PREFIX-" 'index($1, p) == 1 { print $1 }'
}

# Links of the root namespace named <prefix>-..., one a line (a veth shows
# as `name@peer`: the peer is cut off).
links() {
  ip -o link show 2>/dev/null | awk -F': ' -v p="$PREFIX-" '{ sub(/@.*/, "", $2) } index($2, p) == 1 { print $2 }'
}

# Deletes everything named <prefix>-...: host veth ends (their peers go with
# them), namespaces, then the bridge.
teardown() {
  local name
  for name in $(links); do
    [ "$name" = "$PREFIX-br" ] || ip link del "$name" 2>/dev/null || true
  done
  for name in $(namespaces); do
    ip netns del "$name" 2>/dev/null || true
  done
  ip link del "$PREFIX-br" 2>/dev/null || true
  local left
  left="$(namespaces; links)"
  [ -z "$left" ] || die "could not delete: $(echo "$left" | paste -sd " ")"
}

# Shapes what leaves DEV (in namespace NS when given): netem with the
# requested delay and rate, or, without netem (HAVE_NETEM=0), a token bucket
# with the rate alone.
shape() {
  local ns="$1" dev="$2"
  local -a tc=(tc)
  [ -z "$ns" ] || tc=(ip netns exec "$ns" tc)
  if [ "$HAVE_NETEM" -eq 1 ]; then
    local -a args=()
    [ -z "$DELAY" ] || args+=(delay "$DELAY")
    [ -z "$RATE" ] || args+=(rate "$RATE")
    "${tc[@]}" qdisc add dev "$dev" root netem "${args[@]}"
  elif [ -n "$RATE" ]; then
    "${tc[@]}" qdisc add dev "$dev" root tbf rate "$RATE" burst 256kb latency 50ms
  fi
}

# Sets HAVE_NETEM by adding a netem qdisc to DEV and removing it; without
# netem fails, or warns with --if-no-netem tbf.
probe_netem() {
  local dev="$1" out
  if out="$(tc qdisc add dev "$dev" root netem delay 0ms 2>&1)"; then
    tc qdisc del dev "$dev" root
    HAVE_NETEM=1
  elif [ "$IF_NO_NETEM" = tbf ]; then
    HAVE_NETEM=0
    local -a what=()
    [ -z "$RATE" ] || what+=("rate $RATE shaped with tbf")
    [ -z "$DELAY" ] || what+=("no $DELAY delay")
    local joined
    printf -v joined '%s, ' "${what[@]}"
    log "warning: no netem here ($out): ${joined%, }"
  else
    die "no netem here ($out; the kernel needs CONFIG_NET_SCH_NETEM): drop --rate/--delay, or pass --if-no-netem tbf"
  fi
}

UP_DONE=0
# EXIT trap of `up`: an unfinished `up` removes what it created (the prefix
# was free when it began, so everything named <prefix>-... is its own).
up_cleanup() {
  local status=$?
  if [ "$UP_DONE" -ne 1 ]; then
    log "up failed (status $status): removing what it created"
    trap - ERR
    set +e
    teardown
    [ "$status" -ne 0 ] || status=1
  fi
  exit "$status"
}

cmd_up() {
  parse up "$@"
  if ! [[ "$COUNT" =~ ^[0-9]+$ && "$COUNT" -ge 1 && "$COUNT" -le 244 ]]; then
    usage "up needs a node count in 1..244, got '${COUNT}'"
  fi
  [ $((${#PREFIX} + 2 + ${#COUNT})) -le 15 ] ||
    usage "--prefix $PREFIX is too long for $COUNT nodes: $PREFIX-h$COUNT passes 15 characters"
  if ! [[ "$SUBNET" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ &&
    "${BASH_REMATCH[1]}" -le 255 && "${BASH_REMATCH[2]}" -le 255 && "${BASH_REMATCH[3]}" -le 255 ]]; then
    usage "--subnet takes three octets, e.g. 10.77.0: got $SUBNET"
  fi
  case "$NETEM_ON" in node | host | both) ;; *) usage "--netem-on is node, host or both: got $NETEM_ON" ;; esac
  case "$IF_NO_NETEM" in fail | tbf) ;; *) usage "--if-no-netem is fail or tbf: got $IF_NO_NETEM" ;; esac
  require_root
  if [ -n "$RATE$DELAY" ]; then command -v tc >/dev/null || die "no \`tc\` command (iproute2) for --rate/--delay"; fi
  local taken
  taken="$(namespaces; links)"
  [ -z "$taken" ] || die "prefix $PREFIX is in use ($(echo "$taken" | paste -sd " ")): run \`$PROG down --prefix $PREFIX\` first, or pick another prefix"
  local addrs
  addrs="$(ip -4 -o addr show | awk '{ print $4 }')"
  if grep -q "^${SUBNET//./\\.}\." <<<"$addrs"; then
    die "$SUBNET.0/24 is already on an interface here: pick another --subnet"
  fi

  trap up_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local bridge="$PREFIX-br"
  ip link add "$bridge" type bridge
  ip addr add "$SUBNET.1/24" dev "$bridge"
  ip link set "$bridge" up
  HAVE_NETEM=0
  if [ -n "$RATE$DELAY" ]; then probe_netem "$bridge"; fi
  local i ns host peer
  for i in $(seq 1 "$COUNT"); do
    ns="$PREFIX-node-$i" host="$PREFIX-h$i" peer="$PREFIX-p$i"
    ip netns add "$ns"
    ip link add "$host" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip -n "$ns" link set "$peer" name eth0
    ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$SUBNET.1"
    ip link set "$host" master "$bridge"
    ip link set "$host" up
    if [ -n "$RATE$DELAY" ]; then
      if [ "$NETEM_ON" != host ]; then shape "$ns" eth0; fi
      if [ "$NETEM_ON" != node ]; then shape "" "$host"; fi
    fi
  done
  UP_DONE=1
  trap - EXIT INT TERM
  for i in $(seq 1 "$COUNT"); do
    echo "$PREFIX-node-$i $SUBNET.$((10 + i))"
  done
}

cmd_down() {
  parse down "$@"
  require_root
  teardown
}

cmd_exec() {
  parse exec "$@"
  if ! [[ "$NODE" =~ ^[0-9]+$ && "$NODE" -ge 1 ]]; then
    usage "exec needs a node number (1..N), got '${NODE}'"
  fi
  [ ${#CMD[@]} -gt 0 ] || usage "exec needs a command after --"
  require_root
  local ns="$PREFIX-node-$NODE"
  local all
  all="$(ip netns list | awk '{ print $1 }')"
  grep -qxF "$ns" <<<"$all" || die "no namespace $ns (run \`$PROG up\` first)"
  exec ip netns exec "$ns" "${CMD[@]}"
}

CHECK_NS=""
CHECK_HOST=""
check_cleanup() {
  [ -z "$CHECK_HOST" ] || ip link del "$CHECK_HOST" 2>/dev/null || true
  [ -z "$CHECK_NS" ] || ip netns del "$CHECK_NS" 2>/dev/null || true
}

# `check`: prints the reason and exits 3 when a step fails.
cmd_check() {
  parse check "$@"
  unavailable() { log "$*"; exit 3; }
  [ "$(id -u)" -eq 0 ] || unavailable "not root (uid $(id -u)): network namespaces need root"
  command -v ip >/dev/null || unavailable "no \`ip\` command (iproute2)"
  if [ "$NETEM_CHECK" -eq 1 ]; then command -v tc >/dev/null || unavailable "no \`tc\` command (iproute2)"; fi
  # Names of their own (pid-based), so a concurrent `up` is not disturbed.
  local id="knc$(( $$ % 100000 ))"
  trap check_cleanup EXIT
  local out
  out="$(ip netns add "$id-ns" 2>&1)" || unavailable "cannot create a network namespace: $out"
  CHECK_NS="$id-ns"
  out="$(ip link add "$id-h" type veth peer name "$id-p" 2>&1)" || unavailable "cannot create a veth pair: $out"
  CHECK_HOST="$id-h"
  out="$(ip link set "$id-p" netns "$CHECK_NS" 2>&1)" || unavailable "cannot move a veth into a namespace: $out"
  out="$(ip -n "$CHECK_NS" link set "$id-p" up 2>&1)" || unavailable "cannot bring a link up in a namespace: $out"
  if [ "$NETEM_CHECK" -eq 1 ]; then
    out="$(ip netns exec "$CHECK_NS" tc qdisc add dev "$id-p" root netem delay 1ms rate 1gbit 2>&1)" ||
      unavailable "cannot add a netem qdisc (sch_netem): $out"
  fi
  out="$(ip link add "$id-b" type bridge 2>&1)" || unavailable "cannot create a bridge: $out"
  ip link del "$id-b"
  check_cleanup
  trap - EXIT
  echo "network namespaces, veth pairs and bridges work here"
}

[ $# -ge 1 ] || usage "no verb: up, down, exec or check"
verb="$1"
shift
case "$verb" in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  exec) cmd_exec "$@" ;;
  check) cmd_check "$@" ;;
  -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
  *) usage "unknown verb $verb: up, down, exec or check" ;;
esac
