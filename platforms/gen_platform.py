#!/usr/bin/env python3
"""SimGrid platforms (XML, DTD 4.1) for the SMPI scale study: one simulated host per node, its
8 GPUs (GCDs) as 8 ranks on it (hostfile "host:8"; ranks are block-placed, rank = 8 * node + gpu).

  gen_platform.py frontier NODES OUT.xml   Frontier-like: one Dragonfly group (REFERENCE.md §4)
  gen_platform.py dgx-h100 NODES OUT.xml   DGX-H100-like non-blocking fat tree
  (also writes OUT.hosts, the hostfile)

The model, per direction (SPLITDUPLEX: both directions at full speed at once):
  other node  rank -> its node's injection link (all NICs of the node, shared by the flows
              leaving it) -> the fabric (backbone, FATPIPE at one NIC's bandwidth: a flow goes
              through one NIC, and the fabric itself is non-blocking) -> the other node's
              ejection link -> rank
  same node   the node's fabric (loopback, FATPIPE: each flow up to the GPU-to-GPU bandwidth)
Why one host per node, not one per GPU: with one host per GPU (a link per GPU and per NIC) the
flow-level solver re-solved ~P^2 flows at each of ~P^2 completion events and P = 64 took 5 min;
this form takes ~20 s. What it loses: which NIC a GPU uses (HALO's rails; the node's NICs are
pooled, so a flow reaches one NIC's bandwidth however many NICs are idle, but which one is not
modelled) and a per-GPU cap on intra-node injection (FATPIPE caps each flow, not each GPU).
Until 2026-12-04 the backbone was the sum of every node's injection, so a single flow leaving a
node ran at all four NICs' 100 GB/s; a ring all-reduce, with one flow leaving each node, ran 4x
faster than one NIC allows (docs/step_study.md).
Frontier's group fabric is modelled as non-blocking: Slingshot's adaptive routing spreads a
switch's traffic over its 31 local links (16 endpoint ports x 25 GB/s = 400 GB/s in, 31 x 25 GB/s
= 775 GB/s to the group), so inside one group (<= 128 nodes) the NICs bind, not the switches.
Jobs beyond one group (global links ~57% of injection) are not generated: the study stays at or
below 64 nodes. The per-message software overhead is not here: it is CPU time (each rank has a core of its own:
core=8), the simulated
program's --msg-overhead-us, calibrated by platforms/calibrate.sh.
"""
import sys

GB = 1e9

PLATFORMS = {
    # Frontier (REFERENCE.md §4 unless noted).
    "frontier": dict(
        gpus_per_node=8,            # 4 MI250X = 8 GCDs per node
        gpu_fabric_bw=50 * GB,      # Infinity Fabric between GCDs of different MI250X: 50-100
                                    # GB/s; the lower bound (the planner preset's intra_node)
        gpu_fabric_lat=0.9e-6,      # intra-node MPI latency: platforms/calibration.json
                                    # (shared-memory ping-pong measured here)
        injection_bw=4 * 25 * GB,   # 4 Slingshot NICs x 25 GB/s per node and direction
        nic_bw=25 * GB,             # one flow: one NIC (one Slingshot-11 port, 200 Gb/s)
        nic_lat=1.0e-6,             # NIC + first switch, each end: ~2-3 us one-way MPI latency
                                    # over Slingshot-11 (OSU latency class; assumed, not measured)
        fabric_lat=0.35e-6,         # one Rosetta switch hop (~350 ns class; assumed)
    ),
    # DGX H100 (NVIDIA DGX H100 datasheet; src/plan/cluster.cpp's dgx-h100 preset).
    "dgx-h100": dict(
        gpus_per_node=8,            # 8 H100 SXM
        gpu_fabric_bw=450 * GB,     # NVLink 4 via NVSwitch: 900 GB/s bidirectional per GPU
        gpu_fabric_lat=0.9e-6,      # as frontier (measured here)
        injection_bw=8 * 50 * GB,   # 8 ConnectX-7 400 Gb/s (one per GPU) = 8 x 50 GB/s
        nic_bw=50 * GB,             # one flow: one ConnectX-7
        nic_lat=1.0e-6,             # InfiniBand NDR MPI latency ~1-2 us one way (assumed)
        fabric_lat=3 * 0.3e-6,      # leaf-spine-leaf, ~300 ns per hop (assumed)
    ),
}


def platform(kind, nodes):
    p = PLATFORMS[kind]
    # The backbone is FATPIPE (each flow has it whole, flows do not share it: a non-blocking
    # fabric) at one NIC's bandwidth: the cap of a single flow.
    bb = p["nic_bw"]
    return "\n".join([
        '<?xml version="1.0"?>',
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
        '<platform version="4.1">',
        f'<!-- {kind}-like, {nodes} nodes x {p["gpus_per_node"]} GPUs: platforms/gen_platform.py -->',
        f'<cluster id="{kind}" prefix="node" suffix="" radical="0-{nodes - 1}" speed="1Gf" core="{p["gpus_per_node"]}" '
        f'bw="{p["injection_bw"]:.6g}Bps" lat="{p["nic_lat"]:.6g}s" sharing_policy="SPLITDUPLEX" '
        f'bb_bw="{bb:.6g}Bps" bb_lat="{p["fabric_lat"]:.6g}s" bb_sharing_policy="FATPIPE" '
        f'loopback_bw="{p["gpu_fabric_bw"]:.6g}Bps" loopback_lat="{p["gpu_fabric_lat"]:.6g}s"/>',
        "</platform>", ""])


def netns_platform(nodes, rpn, rate_bps, loop_bps, lat_s):
    """scripts/cluster.sh's cluster: NODES hosts of RPN ranks, each host's uplink (a veth pair with
    tbf on both ends) at RATE bits/s each way (SPLITDUPLEX), the bridge a non-blocking switch
    (FATPIPE at the uplink's rate: the cap of one flow), ranks of one node over that namespace's
    loopback TCP (LOOP bytes/s per flow). No CPU: the real cluster's ranks share 2 cores."""
    up = rate_bps / 8
    return "\n".join([
        '<?xml version="1.0"?>',
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
        '<platform version="4.1">',
        f'<!-- scripts/cluster.sh-like, {nodes} nodes x {rpn} ranks, uplinks {rate_bps:.6g} bit/s: platforms/gen_platform.py -->',
        f'<cluster id="netns" prefix="node" suffix="" radical="0-{nodes - 1}" speed="1Gf" core="{rpn}" '
        f'bw="{up:.6g}Bps" lat="{lat_s:.6g}s" sharing_policy="SPLITDUPLEX" '
        f'bb_bw="{up:.6g}Bps" bb_lat="{lat_s:.6g}s" bb_sharing_policy="FATPIPE" '
        f'loopback_bw="{loop_bps:.6g}Bps" loopback_lat="{lat_s:.6g}s"/>',
        "</platform>", ""])


def main(argv):
    if len(argv) >= 2 and argv[1] == "netns":
        # gen_platform.py netns NODES OUT.xml RATE_BITS_PER_S RANKS_PER_NODE [LOOP_BYTES_PER_S LAT_S]
        if len(argv) not in (6, 8):
            sys.exit("usage: gen_platform.py netns NODES OUT.xml RATE_BITS_PER_S RANKS_PER_NODE [LOOP_BPS LAT_S]")
        nodes, rate, rpn = int(argv[2]), float(argv[4]), int(argv[5])
        loop, lat = (float(argv[6]), float(argv[7])) if len(argv) == 8 else (2e9, 30e-6)
        with open(argv[3], "w") as f:
            f.write(netns_platform(nodes, rpn, rate, loop, lat))
        with open(argv[3].removesuffix(".xml") + ".hosts", "w") as f:
            f.write("".join(f"node{n}:{rpn}\n" for n in range(nodes)))
        return
    if len(argv) != 4 or argv[1] not in PLATFORMS:
        sys.exit("usage: gen_platform.py frontier|dgx-h100 NODES OUT.xml (also writes OUT.hosts)")
    try:
        nodes = int(argv[2])
    except ValueError:
        sys.exit(f"gen_platform.py: NODES '{argv[2]}' is not an integer")
    if not 1 <= nodes <= 128:
        sys.exit(f"gen_platform.py: NODES {nodes} must be in [1, 128] (one Dragonfly group)")
    with open(argv[3], "w") as f:
        f.write(platform(argv[1], nodes))
    gpus = PLATFORMS[argv[1]]["gpus_per_node"]
    with open(argv[3].removesuffix(".xml") + ".hosts", "w") as f:
        f.write("".join(f"node{n}:{gpus}\n" for n in range(nodes)))


if __name__ == "__main__":
    main(sys.argv)
