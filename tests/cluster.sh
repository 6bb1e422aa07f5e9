#!/usr/bin/env bash
# ctest cluster_smoke (issue 39, item 1): a real 2-node x 2-rank cluster on this machine, made of
# network namespaces by scripts/cluster.sh, with MPI over TCP between them.
#   1. Cluster A (unlimited links) and cluster B (200 Mbit/s tbf on every uplink) up at once: two
#      clusters must not collide.
#   2. `moetrain bench a2a` (256K..1M, flat, rbd, halo, rbd-halo) through `cluster.sh run` on A:
#      moetrain's own topology detection (from the launcher, no --topo.ranks-per-node) must report
#      "2 nodes x 2 ranks/node", and every row must have #wrong 0.
#   3. flat at 1M on B: #wrong 0, a tbf qdisc on each uplink, and the time no lower than the link
#      allows (half the inter-node bytes through one 200 Mbit/s uplink, with a 2x margin: a bound,
#      not a timing race). The ratio to A is printed, not asserted.
#   4. training across nodes: 10 steps of EP 2 x DP 2 on A equal the same layout on one host (nodes
#      emulated with --topo.ranks-per-node 2) bit for bit (weights and every logged loss), and one
#      process (global batch 8) to 1e-6 relative at every step (tests/parity.sh's bound).
#   5. down both; check-clean; the host's own links and hostname are what they were.
#   6. the link-cut fault (tests/cluster_faults.sh cut, a cluster of its own): every rank ends within
#      --comm.timeout + 10 s naming the operation and the ranks not heard from; the last checkpoint
#      resumes to the uninterrupted run's weights bit for bit.
# Exits 77 (SKIPPED) with the reason where namespaces cannot be made (not root, no iproute2, a
# sandbox without CAP_NET_ADMIN) or there is no mpirun; never fails for that.
# Usage: tests/cluster.sh MOETRAIN [SOURCE_DIR]
set -euo pipefail
MOETRAIN=$(realpath "${1:?usage: tests/cluster.sh MOETRAIN [SOURCE_DIR]}")
SRC=$(realpath "${2:-$(dirname "$0")/..}")
CLUSTER="$SRC/scripts/cluster.sh"
source "$SRC/tests/lib.sh"  # mpi, compare

if ! why=$("$CLUSTER" can); then echo "SKIPPED: cannot make network namespaces here (${why#no: })"; exit 77; fi
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun (openmpi-bin)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIPPED: no python3 to read the JSON"; exit 77; }

work=$(mktemp -d)
A="a$$"; B="b$$"; A=${A:0:8}; B=${B:0:8}
host_links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)
host_name_before=$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)
# Whatever happens, both clusters go down.
trap '"$CLUSTER" down --name "$A" >/dev/null 2>&1 || true; "$CLUSTER" down --name "$B" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$CLUSTER" up 2 2 --name "$A" > /dev/null
"$CLUSTER" up 2 2 --name "$B" --rate 200mbit > /dev/null
"$CLUSTER" list

# The subnets differ and each uplink of B carries tbf at 200 Mbit/s (both directions).
grep -q "^SUBNET=" "${TMPDIR:-/tmp}/moetrain-cluster-$A/state" || fail "no state file for $A"
sa=$(sed -n 's/^SUBNET=//p' "${TMPDIR:-/tmp}/moetrain-cluster-$A/state")
sb=$(sed -n 's/^SUBNET=//p' "${TMPDIR:-/tmp}/moetrain-cluster-$B/state")
[ "$sa" != "$sb" ] || fail "clusters $A and $B share subnet $sa"
for i in 0 1; do
  tc -n "moetrain-$B-n$i" qdisc show dev "mt$B-n$i" | grep -q "tbf.*rate 200Mbit" || fail "no tbf on mt$B-n$i"
  tc -n "moetrain-$B-sw" qdisc show dev "mt$B-s$i" | grep -q "tbf.*rate 200Mbit" || fail "no tbf on mt$B-s$i"
  tc -n "moetrain-$A-n$i" qdisc show dev "mt$A-n$i" | grep -q tbf && fail "tbf on unlimited mt$A-n$i"
done

bench=(bench a2a --iters 5 --warmup 2 --json)
"$CLUSTER" run --name "$A" -- "$MOETRAIN" "${bench[@]}" -b 256K -e 1M > "$work/a.json" 2> "$work/a.err" ||
  { cat "$work/a.err"; fail "bench a2a on cluster $A"; }
"$CLUSTER" run --name "$B" -- "$MOETRAIN" "${bench[@]}" -b 1M -e 1M --algos flat > "$work/b.json" 2> "$work/b.err" ||
  { cat "$work/b.err"; fail "bench a2a on cluster $B"; }

python3 - "$work/a.json" "$work/b.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
bad = []
for name, r in (("unlimited", a), ("200mbit", b)):
    if "2 nodes x 2 ranks/node" not in r["topology"]:
        bad.append(f"{name}: topology is '{r['topology']}', not 2 nodes x 2 ranks/node")
print(f"topology: {a['topology']}")
print(f"{'link':>9} {'size':>8} {'algo':>8} {'time(us)':>10} {'inter-node(B)':>13} {'#wrong':>6}")
for name, r in (("unlimited", a), ("200mbit", b)):
    for row in r["rows"]:
        print(f"{name:>9} {row['size']:>8} {row['algo']:>8} {row['time_us']:>10.0f} "
              f"{row['inter_node_bytes']:>13} {row['wrong']:>6}")
        if row["wrong"] != 0:
            bad.append(f"{name} {row['algo']} {row['size']}: #wrong {row['wrong']}")
got = {(x["algo"], x["size"]) for x in a["rows"]}
want = {(al, s) for al in ("flat", "rbd", "halo", "rbd-halo") for s in (262144, 524288, 1048576)}
if got != want:
    bad.append(f"unlimited rows {sorted(got)} != {sorted(want)}")
# Rate: each node's uplink carries about half the inter-node bytes each way; at 200 Mbit/s that
# takes at least this long. Half of it as the bound leaves room for tbf's burst and uneven splits.
flat_b = next(x for x in b["rows"] if x["algo"] == "flat")
floor_us = flat_b["inter_node_bytes"] / 2 * 8 / 200e6 * 1e6 / 2
flat_a = next(x for x in a["rows"] if x["algo"] == "flat" and x["size"] == 1048576)
print(f"flat 1M: unlimited {flat_a['time_us']:.0f} us, 200mbit {flat_b['time_us']:.0f} us "
      f"(x{flat_b['time_us'] / flat_a['time_us']:.2f}); link floor/2 {floor_us:.0f} us")
if flat_b["time_us"] < floor_us:
    bad.append(f"200mbit flat {flat_b['time_us']:.0f} us is below what the link allows ({floor_us:.0f} us): rate not applied")
for m in bad:
    print("FAIL:", m)
sys.exit(1 if bad else 0)
EOF

# Training across the nodes against the same layout on one host and against one process.
train=(train --preset test-moe --steps 10 --seq-len 32 --eval-every 0 --eval-batches 1 --quiet --lr 3e-3 --warmup 5)
"$CLUSTER" run --name "$A" -- "$MOETRAIN" "${train[@]}" --batch 2 --ep 2 --dp 2 --out "$work/cluster" \
  > "$work/cluster.log" 2>&1 || { cat "$work/cluster.log"; fail "EP 2 x DP 2 training on cluster $A"; }
mpi 4 "$MOETRAIN" "${train[@]}" --batch 2 --ep 2 --dp 2 \
  --topo.ranks-per-node 2 --out "$work/host" > "$work/host.log" 2>&1 || { cat "$work/host.log"; fail "the same layout on one host"; }
"$MOETRAIN" "${train[@]}" --batch 8 --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; fail "one process"; }
compare weights "$work/cluster" "$work/host" --name "EP 2 x DP 2 across the cluster against one host" ||
  fail "EP 2 x DP 2: the weights trained across the cluster differ from the same layout on one host"
q=(--keys loss,ce_loss,aux_loss,grad_norm)
compare losses "$work/cluster" "$work/host" "${q[@]}" --name "EP 2 x DP 2 across the cluster against one host" &&
  compare losses "$work/cluster" "$work/one" "${q[@]}" --rtol 1e-6 --name "EP 2 x DP 2 across the cluster against one process" ||
  fail "training across nodes"

# Down (from here the EXIT trap has nothing left to do) and nothing of ours left.
"$CLUSTER" down --name "$A"
"$CLUSTER" down --name "$B"
"$CLUSTER" check-clean --name "$A" || fail "cluster $A left something"
"$CLUSTER" check-clean --name "$B" || fail "cluster $B left something"
ip netns list | grep -E "^moetrain-($A|$B)-" && fail "namespaces left"
[ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$host_links_before" ] ||
  fail "the host's links changed: $(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')"
[ "$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname)" = "$host_name_before" ] || fail "the host's hostname changed"
"$SRC/tests/cluster_faults.sh" "$MOETRAIN" "$SRC" cut || fail "the link-cut fault"
echo "PASS: cluster_smoke (2 nodes x 2 ranks, unlimited and 200mbit; training across nodes; link cut; nothing left)"
