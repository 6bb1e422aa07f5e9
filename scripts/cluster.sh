#!/usr/bin/env bash
# A small cluster on one machine (issue 39): NODES network namespaces, each a "host" with one
# uplink (a veth pair) to a switch (a bridge) that lives in its own namespace. Nothing is created
# in the host's namespace: no interface, address, route or qdisc of the host is touched, and the
# host's hostname is never changed (each node gets its own UTS namespace, made by the agent).
#
#   scripts/cluster.sh up NODES RANKS_PER_NODE [--rate R] [--rate-node I=R ...] [--name NAME]
#   scripts/cluster.sh run [--name NAME] [--np N] -- COMMAND...
#   scripts/cluster.sh down [--name NAME | --all-ours]
#   scripts/cluster.sh check-clean [--name NAME]
#   scripts/cluster.sh list
#   scripts/cluster.sh link [--name NAME] NODE up|down    (a cut uplink; faults)
#   scripts/cluster.sh rate [--name NAME] NODE R|unlimited  (a node's uplink rate, both directions)
#
# Layout of cluster ID (ID: 1-8 of [a-z0-9], random unless --name):
#   namespaces   moetrain-ID-sw (the switch, where mpirun runs: the "login node")
#                moetrain-ID-n0 .. moetrain-ID-n<NODES-1> (the nodes)
#   links        mtID-br (bridge, in -sw), mtID-s<i> (switch port, in -sw) <-> mtID-n<i> (node i's
#                uplink, in -n<i>)
#   addresses    198.18.K.<i+1>/24 on node i, 198.18.K.254/24 on the bridge; K (1..254) is the
#                lowest index no other live cluster uses. Only 198.18.0.0/15 (RFC 2544) is used.
#   rate         --rate R shapes both directions of every uplink with tbf (egress of mtID-n<i> and
#                of mtID-s<i>); --rate-node I=R overrides node I. R: <number>{bit,kbit,mbit,gbit}.
#                This kernel has tbf, htb and pfifo but no netem: rate only, no added delay.
#   state        ${TMPDIR:-/tmp}/moetrain-cluster-ID/: state (sourced by this script), hostfile,
#                agent (Open MPI's plm_rsh_agent), nodes.txt (name address namespace rate).
#
# `run` starts mpirun inside the switch namespace with the hostfile (n<i> slots=RANKS_PER_NODE),
# the agent as plm_rsh_agent, TCP only (btl tcp,self; shared memory across namespaces that share
# /dev/shm segfaulted, see NOTES.md A6) and both OOB and BTL restricted to the cluster's subnet.
# Waiting ranks yield the CPU (mpi_yield_when_idle): every node's slots fit its "host", so Open MPI
# would busy-poll, but all nodes share this machine's cores, and a polling rank then holds a core the
# rank it waits for needs: with 4 ranks on 2 cores every exchange took 8, 16 or 24 ms (scheduler
# slices) whatever its size; yielding, 0.3 ms at 256 KiB (docs/cluster.md).
# Ranks are placed by slot (block: ranks 0..R-1 on n0, ...) as a real launcher would; each node's
# orted sets OMPI_COMM_WORLD_LOCAL_SIZE, which moetrain's topology detection reads, so
# --topo.ranks-per-node is not needed and must not be used on this path.
#
# `down` kills the processes left inside the cluster's namespaces (only those), deletes the node
# namespaces (which deletes their veths), the switch namespace (bridge and ports with it) and the
# state folder. It is idempotent. `check-clean` lists any namespace, link or state folder of ours
# still present and exits 1 if there is one. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ip and tc.
set -euo pipefail

PREFIX=moetrain                          # namespace prefix: moetrain-ID-...
STATE_ROOT="${TMPDIR:-/tmp}"
NET_PREFIX=198.18                        # every address lives in 198.18.0.0/15

die() { echo "cluster.sh: $*" >&2; exit 2; }
say() { echo "cluster.sh: $*" >&2; }

state_dir() { echo "$STATE_ROOT/$PREFIX-cluster-$1"; }

valid_id() { [[ "$1" =~ ^[a-z0-9]{1,8}$ ]]; }

# IDs of live clusters: from state folders and from namespaces (a half-made one has only the latter).
our_ids() {
  {
    for d in "$STATE_ROOT/$PREFIX-cluster-"*; do
      [ -d "$d" ] && echo "${d##*/"$PREFIX"-cluster-}"
    done
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$PREFIX-\([a-z0-9]\{1,8\}\)-\(sw\|n[0-9]\+\)\$/\1/p"
  } | sort -u
}

# The cluster a command is about: --name, else the only live one.
pick_id() {
  local id="$1"
  if [ -n "$id" ]; then valid_id "$id" || die "bad cluster name '$id' (1-8 of [a-z0-9])"; echo "$id"; return; fi
  local ids; ids=$(our_ids)
  [ -n "$ids" ] || die "no cluster is up (scripts/cluster.sh up NODES RANKS_PER_NODE)"
  [ "$(echo "$ids" | wc -l)" -eq 1 ] || die "several clusters are up ($(echo "$ids" | tr "\n" " ")): pass --name"
  echo "$ids"
}

# A tc rate "<n><unit>" as bits per second (for tbf's burst); dies on anything else.
rate_bps() {
  local r="$1" n u
  [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "bad rate '$r' (e.g. 200mbit, 1gbit, 500kbit)"
  n=$((10#${BASH_REMATCH[1]})); u=${BASH_REMATCH[2]}
  [ "$n" -gt 0 ] || die "rate '$r' must be > 0"
  case $u in bit) echo $((n));; kbit) echo $((n * 1000));; mbit) echo $((n * 1000000));;
             gbit) echo $((n * 1000000000));; esac
}

# tbf on DEV in namespace NS: burst = 4 ms of the rate (at least 32 KiB, so the 1-tick bucket holds
# a GSO segment), queue bounded by 50 ms of latency.
shape() {
  local ns="$1" dev="$2" rate="$3" bps burst
  bps=$(rate_bps "$rate")
  burst=$((bps / 8 / 250)); [ "$burst" -ge 32768 ] || burst=32768
  ip -n "$ns" link set "$dev" up
  tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
}

# Pick K in 1..254 not used by another live cluster's state file.
free_index() {
  local used k
  used=$(cat "$STATE_ROOT/$PREFIX-cluster-"*/state 2>/dev/null | sed -n 's/^NET_INDEX=//p' | sort -n)
  for k in $(seq 1 254); do
    echo "$used" | grep -qx "$k" || { echo "$k"; return; }
  done
  die "all 254 cluster subnets are in use"
}

# Can this process make network namespaces? Prints why not and returns 1 if it cannot.
can_netns() {
  command -v ip >/dev/null || { echo "no 'ip' (iproute2: scripts/setup.sh installs it)"; return 1; }
  command -v tc >/dev/null || { echo "no 'tc' (iproute2)"; return 1; }
  command -v unshare >/dev/null || { echo "no 'unshare' (util-linux)"; return 1; }
  [ "$(id -u)" -eq 0 ] || { echo "not root: network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN"; return 1; }
  local probe="$PREFIX-probe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then echo "ip netns add failed: $err"; return 1; fi
  # A namespace may be creatable while veths are not (some sandboxes): try one inside it.
  if ! err=$(ip -n "$probe" link add mtprobe0 type veth peer name mtprobe1 2>&1); then
    ip netns del "$probe" 2>/dev/null || true; echo "veth pairs cannot be made: $err"; return 1
  fi
  ip netns del "$probe"
}

cmd_up() {
  local nodes="" rpn="" rate="" id="" i
  local -A node_rate=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) [ $# -ge 2 ] || die "--rate needs a value"; rate="$2"; shift 2;;
      --rate-node)
        [ $# -ge 2 ] || die "--rate-node needs I=R"
        [[ "$2" =~ ^([0-9]+)=(.+)$ ]] || die "--rate-node wants I=R, got '$2'"
        node_rate[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"; shift 2;;
      --name) [ $# -ge 2 ] || die "--name needs a value"; id="$2"; shift 2;;
      -*) die "up: unknown option '$1'";;
      *) if [ -z "$nodes" ]; then nodes="$1"; elif [ -z "$rpn" ]; then rpn="$1"; else die "up: extra argument '$1'"; fi; shift;;
    esac
  done
  [[ "$nodes" =~ ^[0-9]+$ && "$nodes" -ge 1 && "$nodes" -le 64 ]] || die "up: NODES must be 1..64 (got '$nodes')"
  [[ "$rpn" =~ ^[0-9]+$ && "$rpn" -ge 1 ]] || die "up: RANKS_PER_NODE must be >= 1 (got '$rpn')"
  [ -z "$rate" ] || rate_bps "$rate" >/dev/null
  for i in "${!node_rate[@]}"; do
    [ "$i" -lt "$nodes" ] || die "--rate-node $i: there are only $nodes nodes"
    rate_bps "${node_rate[$i]}" >/dev/null
  done
  local why; why=$(can_netns) || die "cannot make network namespaces here: $why"
  if [ -z "$id" ]; then id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n'); fi
  valid_id "$id" || die "bad cluster name '$id' (1-8 of [a-z0-9])"
  local dir; dir=$(state_dir "$id")
  [ ! -e "$dir" ] || die "cluster '$id' exists already ($dir)"
  ip netns list | awk '{print $1}' | grep -q "^$PREFIX-$id-" && die "namespaces of '$id' exist already"
  mkdir -p "$dir"
  # From here on a failure leaves a half-made cluster: take it down before exiting.
  UP_ID="$id"
  # shellcheck disable=SC2154  # rc is assigned inside the trap
  trap 'rc=$?; if [ -n "${UP_ID:-}" ]; then say "up failed; removing cluster $UP_ID"; down_one "$UP_ID"; fi; exit $rc' EXIT
  local k; k=$(free_index)
  local sw="$PREFIX-$id-sw" br="mt$id-br" subnet="$NET_PREFIX.$k.0/24"
  { echo "ID=$id"; echo "NODES=$nodes"; echo "RPN=$rpn"; echo "NET_INDEX=$k"; echo "SUBNET=$subnet"
    echo "SWITCH_NS=$sw"; echo "SWITCH_ADDR=$NET_PREFIX.$k.254"; } > "$dir/state"

  # The switch: a namespace holding a bridge; its address is where mpirun's HNP listens.
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add "$br" type bridge
  ip -n "$sw" addr add "$NET_PREFIX.$k.254/24" dev "$br"
  ip -n "$sw" link set "$br" up

  : > "$dir/nodes.txt"; : > "$dir/hostfile"
  local map=""
  for ((i = 0; i < nodes; i++)); do
    local ns="$PREFIX-$id-n$i" up="mt$id-n$i" port="mt$id-s$i" addr="$NET_PREFIX.$k.$((i + 1))"
    local r="${node_rate[$i]:-$rate}"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # The pair is made inside the switch namespace with its node end moved straight into the node,
    # so neither end ever exists in the host's namespace.
    ip -n "$sw" link add "$port" type veth peer name "$up" netns "$ns"
    ip -n "$sw" link set "$port" master "$br"
    ip -n "$sw" link set "$port" up
    ip -n "$ns" addr add "$addr/24" dev "$up"
    ip -n "$ns" link set "$up" up
    if [ -n "$r" ]; then shape "$ns" "$up" "$r"; shape "$sw" "$port" "$r"; fi
    echo "n$i $addr $ns ${r:-unlimited}" >> "$dir/nodes.txt"
    echo "n$i slots=$rpn" >> "$dir/hostfile"
    map+="    n$i|$addr) ns=$ns; name=n$i;;"$'\n'
  done

  # Open MPI's plm_rsh_agent: called as `agent [ssh options] HOST COMMAND...` from the switch
  # namespace. It runs COMMAND (a remote shell's command line) in HOST's namespace, in a fresh UTS
  # namespace whose hostname is HOST, so each node has its own hostname and the host's is untouched.
  cat > "$dir/agent" <<EOF
#!/bin/sh
# plm_rsh_agent for moetrain cluster $id (written by scripts/cluster.sh up).
set -eu
while [ \$# -gt 0 ]; do
  case "\$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2;;   # ssh options that take a value
    -*) shift;;
    *) break;;
  esac
done
[ \$# -ge 2 ] || { echo "agent: usage: agent [opts] HOST COMMAND..." >&2; exit 255; }
host="\$1"; shift
case "\$host" in
$map    *) echo "agent: unknown host '\$host' in cluster $id" >&2; exit 255;;
esac
host_uts=\$(readlink /proc/\$\$/ns/uts)
exec ip netns exec "\$ns" unshare --uts sh -c '
  # Refuse to rename anything but a new UTS namespace (never the host).
  [ "\$(readlink /proc/self/ns/uts)" != "\$1" ] || { echo "agent: no new UTS namespace" >&2; exit 255; }
  echo "\$2" > /proc/sys/kernel/hostname
  shift 2
  exec sh -c "\$*"' agent-node "\$host_uts" "\$name" "\$@"
EOF
  chmod +x "$dir/agent"
  UP_ID=""; trap - EXIT
  say "cluster $id up: $nodes nodes x $rpn ranks/node on $subnet, rate ${rate:-unlimited}$(for i in "${!node_rate[@]}"; do printf ', n%s %s' "$i" "${node_rate[$i]}"; done); state in $dir"
  echo "$id"
}

cmd_run() {
  local id="" np=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) [ $# -ge 2 ] || die "--name needs a value"; id="$2"; shift 2;;
      --np) [ $# -ge 2 ] || die "--np needs a value"; np="$2"; shift 2;;
      --) shift; break;;
      *) die "run: unknown option '$1' (COMMAND goes after --)";;
    esac
  done
  [ $# -ge 1 ] || die "run: no COMMAND (scripts/cluster.sh run [--name NAME] -- COMMAND...)"
  id=$(pick_id "$id")
  local dir; dir=$(state_dir "$id")
  [ -f "$dir/state" ] || die "cluster '$id' has no state file ($dir/state)"
  # shellcheck disable=SC1091
  . "$dir/state"
  [ -n "$np" ] || np=$((NODES * RPN))   # NODES, RPN, SUBNET, SWITCH_NS: from the state file
  local mpirun; mpirun=$(command -v mpirun) || die "no mpirun (openmpi-bin)"
  # mpirun runs on the switch, the cluster's login node; only the agent enters the nodes.
  exec ip netns exec "$SWITCH_NS" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$mpirun" -np "$np" --hostfile "$dir/hostfile" --oversubscribe --map-by slot --bind-to none \
    --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$SUBNET" --mca btl_tcp_if_include "$SUBNET" --mca btl tcp,self \
    --mca mpi_yield_when_idle 1 -x OPENBLAS_NUM_THREADS=1 "$@"
}

# Remove one cluster: its processes, namespaces (and so its links and qdiscs) and state folder.
down_one() {
  local id="$1" ns pids p
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-$id-(sw|n[0-9]+)\$" || true); do
    # Only processes inside this cluster's namespaces (ranks, orteds, mpirun) are killed.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
  done
  # Node namespaces first (their veth ends die with them, and the switch ports with those).
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-$id-n[0-9]+\$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns del "$PREFIX-$id-sw" 2>/dev/null || true
  rm -rf "$(state_dir "$id")"
}

cmd_down() {
  local id="" all=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) [ $# -ge 2 ] || die "--name needs a value"; id="$2"; shift 2;;
      --all-ours) all=1; shift;;
      *) die "down: unknown option '$1'";;
    esac
  done
  local ids
  if [ "$all" -eq 1 ]; then ids=$(our_ids)
  elif [ -n "$id" ]; then valid_id "$id" || die "bad cluster name '$id'"; ids="$id"
  else ids=$(our_ids); [ "$(echo "$ids" | grep -c .)" -le 1 ] || die "several clusters are up ($(echo "$ids" | tr "\n" " ")): pass --name or --all-ours"
  fi
  for id in $ids; do down_one "$id"; say "cluster $id down"; done
  if [ "$all" -eq 1 ]; then cmd_check_clean; elif [ -n "$ids" ]; then
    for id in $ids; do cmd_check_clean --name "$id"; done
  fi
}

# Lists what of ours is still present; exit 1 if anything is.
cmd_check_clean() {
  local id=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) [ $# -ge 2 ] || die "--name needs a value"; id="$2"; shift 2;;
      *) die "check-clean: unknown option '$1'";;
    esac
  done
  local pat_ns="^$PREFIX-${id:-[a-z0-9]+}-(sw|n[0-9]+|probe[0-9]*)\$" pat_link="^mt${id:-[a-z0-9]+}-(br|s[0-9]+|n[0-9]+)(@|\$)"
  [ -n "$id" ] || pat_ns="^$PREFIX-([a-z0-9]+-(sw|n[0-9]+)|probe[0-9]+)\$"
  local left=0 x
  for x in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$pat_ns" || true); do
    echo "left: namespace $x"; left=1
  done
  # Nothing is ever made in the host's namespace; check anyway (veths and bridges by our names).
  for x in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -E "$pat_link" || true); do
    echo "left: host link $x"; left=1
  done
  for x in "$STATE_ROOT/$PREFIX-cluster-"${id:-*}; do
    [ -e "$x" ] && { echo "left: state folder $x"; left=1; }
  done
  if [ "$left" -eq 0 ]; then say "clean: no namespace, link or state folder of ours${id:+ (cluster $id)}"; fi
  return "$left"
}

# The cluster's state file, sourced; NODE checked against it.
load_node() {
  local id="$1" node="$2" dir
  dir=$(state_dir "$id")
  [ -f "$dir/state" ] || die "cluster '$id' has no state file ($dir/state)"
  # shellcheck disable=SC1091
  . "$dir/state"
  [[ "$node" =~ ^[0-9]+$ && "$node" -lt "$NODES" ]] || die "node '$node': cluster $id has nodes 0..$((NODES - 1))"
}

# Both ends of node NODE's uplink up or down (a cut cable: nothing passes either way).
cmd_link() {
  local id="" args=()
  while [ $# -gt 0 ]; do
    case "$1" in --name) id="$2"; shift 2;; *) args+=("$1"); shift;; esac
  done
  [ ${#args[@]} -eq 2 ] || die "link: want NODE up|down"
  local node="${args[0]}" state="${args[1]}"
  [[ "$state" = up || "$state" = down ]] || die "link: state '$state' is not up or down"
  id=$(pick_id "$id"); load_node "$id" "$node"
  ip -n "$PREFIX-$id-n$node" link set "mt$id-n$node" "$state"
  ip -n "$PREFIX-$id-sw" link set "mt$id-s$node" "$state"
  say "cluster $id: node $node's uplink $state"
}

# Node NODE's uplink rate, both directions, while the cluster runs (tbf replaced or removed).
cmd_rate() {
  local id="" args=()
  while [ $# -gt 0 ]; do
    case "$1" in --name) id="$2"; shift 2;; *) args+=("$1"); shift;; esac
  done
  [ ${#args[@]} -eq 2 ] || die "rate: want NODE R|unlimited"
  local node="${args[0]}" rate="${args[1]}"
  id=$(pick_id "$id"); load_node "$id" "$node"
  local ns="$PREFIX-$id-n$node" sw="$PREFIX-$id-sw"
  if [ "$rate" = unlimited ]; then
    tc -n "$ns" qdisc del dev "mt$id-n$node" root 2>/dev/null || true
    tc -n "$sw" qdisc del dev "mt$id-s$node" root 2>/dev/null || true
  else
    rate_bps "$rate" >/dev/null
    shape "$ns" "mt$id-n$node" "$rate"; shape "$sw" "mt$id-s$node" "$rate"
  fi
  say "cluster $id: node $node's uplink at $rate"
}

cmd_list() {
  local id
  for id in $(our_ids); do
    echo "cluster $id:"
    if [ -f "$(state_dir "$id")/nodes.txt" ]; then sed 's/^/  /' "$(state_dir "$id")/nodes.txt"
    else echo "  (no state file: half-made; scripts/cluster.sh down --name $id)"; fi
  done
}

[ $# -ge 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
sub="$1"; shift
case "$sub" in
  up) cmd_up "$@";;
  run) cmd_run "$@";;
  down) cmd_down "$@";;
  check-clean) cmd_check_clean "$@";;
  list) cmd_list "$@";;
  link) cmd_link "$@";;
  rate) cmd_rate "$@";;
  can) if why=$(can_netns); then echo "yes"; else echo "no: $why"; exit 77; fi;;
  -h|--help|help) sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//';;
  *) die "unknown command '$sub' (up, run, down, check-clean, list, link, rate, can)";;
esac
