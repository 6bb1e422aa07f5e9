#!/usr/bin/env python3
"""SimGrid platforms (XML, DTD 4.1) for the SMPI scale study: one simulated host per GPU (GCD).

  gen_platform.py frontier NODES OUT.xml   Frontier-like Dragonfly (REFERENCE.md §4)
  gen_platform.py dgx-h100 NODES OUT.xml   DGX-H100-like non-blocking fat tree

Hosts are named n<node>g<gpu>; ranks are block-placed (rank = 8 * node + gpu), so the hostfile
lists the hosts in that order (hostfile_for). The model, per direction (links are split into an
up and a down link, so both directions run at full speed at once):

  same node   gpu a -> gpu b: ifup[a] -> ifdown[b]    (the GPU's own share of the node fabric)
  other node  gpu a -> gpu b: nicup[a's NIC] -> switch hop(s) -> nicdown[b's NIC]
              (a GPU uses its node's NIC number gpu * nics / 8: HALO's rails line up)

Switch fabric: inside a Dragonfly group, Slingshot's adaptive routing spreads a switch's traffic
over its ~31 local links, so a switch is modelled as one up and one down link of that aggregate;
between groups, one up and one down link per group carry the global bandwidth (a fraction of the
group's injection). The fat tree is non-blocking: one FATPIPE core hop. Every figure below names
its source; the per-message software overhead is not here (it is CPU time: the simulated
program's --msg-overhead-us, calibrated by platforms/calibrate.sh).
"""
import sys

GB = 1e9

# Frontier (REFERENCE.md §4 unless noted).
FRONTIER = dict(
    gpus_per_node=8,            # 4 MI250X = 8 GCDs per node
    gpu_fabric_bw=50 * GB,      # Infinity Fabric between GCDs of different MI250X: 50-100 GB/s;
                                # the lower bound, per GCD and direction (the planner's intra_node)
    gpu_fabric_lat=1.0e-6,      # intra-node MPI latency class (calibrated order; see calibrate.sh)
    nics_per_node=4,            # 4 Slingshot NICs per node, one per MI250X (2 GCDs share one)
    nic_bw=25 * GB,             # 25 GB/s per NIC and direction (Slingshot 200 Gb/s)
    nic_lat=1.0e-6,             # NIC + first switch hop; 2 x 1 us + switch hops ~ the ~2-3 us
                                # inter-node MPI latency of Slingshot (published OSU latency)
    nodes_per_switch=4,         # 128 nodes on 32 switches per group
    switch_local_links=31,      # 32 switches in a group, fully connected: 31 local links each
    switch_link_bw=25 * GB,     # one Slingshot link (200 Gb/s) per switch pair
    switch_hop_lat=0.35e-6,     # Rosetta switch port-to-port latency (~350 ns class)
    nodes_per_group=128,        # one group = one cabinet = 128 nodes
    global_fraction=0.57,       # global bandwidth about 57% of injection
)

# DGX H100 (NVIDIA DGX H100 datasheet / SuperPOD reference architecture; cluster.cpp's preset).
DGX_H100 = dict(
    gpus_per_node=8,            # 8 H100 SXM
    gpu_fabric_bw=450 * GB,     # NVLink 4 via NVSwitch: 900 GB/s bidirectional = 450 per direction
    gpu_fabric_lat=1.0e-6,
    nics_per_node=8,            # 8 ConnectX-7, one per GPU (rail-optimised)
    nic_bw=50 * GB,             # 400 Gb/s InfiniBand NDR = 50 GB/s per direction
    nic_lat=1.0e-6,             # NIC + leaf: InfiniBand MPI latency ~1-2 us
    switch_hop_lat=0.3e-6,      # per switch hop (NDR switch ~ 130-300 ns)
)


def link(lines, lid, bw, lat, policy="SHARED"):
    lines.append(f'    <link id="{lid}" bandwidth="{bw:.6g}Bps" latency="{lat:.6g}s" '
                 f'sharing_policy="{policy}"/>')


def node_zone(lines, n, p):
    """Zone of one node: its GPUs, their fabric links, the node's NICs, and a gateway."""
    g, nics = p["gpus_per_node"], p["nics_per_node"]
    lines.append(f'  <zone id="z{n}" routing="Full">')
    for j in range(g):
        lines.append(f'    <host id="n{n}g{j}" speed="1Gf"/>')
    lines.append(f'    <router id="gw{n}"/>')
    for j in range(g):
        link(lines, f"if_up{n}_{j}", p["gpu_fabric_bw"], p["gpu_fabric_lat"] / 2)
        link(lines, f"if_dn{n}_{j}", p["gpu_fabric_bw"], p["gpu_fabric_lat"] / 2)
    for k in range(nics):
        link(lines, f"nic_up{n}_{k}", p["nic_bw"], p["nic_lat"])
        link(lines, f"nic_dn{n}_{k}", p["nic_bw"], p["nic_lat"])
    for a in range(g):
        for b in range(g):
            if a != b:
                lines.append(f'    <route src="n{n}g{a}" dst="n{n}g{b}" symmetrical="NO">'
                             f'<link_ctn id="if_up{n}_{a}"/><link_ctn id="if_dn{n}_{b}"/></route>')
    for j in range(g):
        k = j * nics // g
        lines.append(f'    <route src="n{n}g{j}" dst="gw{n}" symmetrical="NO">'
                     f'<link_ctn id="nic_up{n}_{k}"/></route>')
        lines.append(f'    <route src="gw{n}" dst="n{n}g{j}" symmetrical="NO">'
                     f'<link_ctn id="nic_dn{n}_{k}"/></route>')
    lines.append("  </zone>")


def platform(kind, nodes):
    p = FRONTIER if kind == "frontier" else DGX_H100
    lines = ['<?xml version="1.0"?>',
             '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">',
             '<platform version="4.1">',
             f'<!-- {kind}-like, {nodes} nodes x {p["gpus_per_node"]} GPUs: platforms/gen_platform.py -->',
             '<zone id="world" routing="Full">']
    for n in range(nodes):
        node_zone(lines, n, p)
    if kind == "frontier":
        sw = lambda n: n // p["nodes_per_switch"]
        grp = lambda n: n // p["nodes_per_group"]
        switches = (nodes + p["nodes_per_switch"] - 1) // p["nodes_per_switch"]
        groups = (nodes + p["nodes_per_group"] - 1) // p["nodes_per_group"]
        sw_bw = p["switch_local_links"] * p["switch_link_bw"]
        for s in range(switches):
            link(lines, f"sw_up{s}", sw_bw, p["switch_hop_lat"])
            link(lines, f"sw_dn{s}", sw_bw, 0)
        grp_bw = p["global_fraction"] * p["nodes_per_group"] * p["nics_per_node"] * p["nic_bw"]
        for q in range(groups):
            link(lines, f"gl_up{q}", grp_bw, p["switch_hop_lat"])
            link(lines, f"gl_dn{q}", grp_bw, p["switch_hop_lat"])
        link(lines, "xbar", sw_bw, p["switch_hop_lat"], "FATPIPE")  # within one switch
        for a in range(nodes):
            for b in range(nodes):
                if a == b:
                    continue
                if sw(a) == sw(b):
                    hops = ["xbar"]
                elif grp(a) == grp(b):
                    hops = [f"sw_up{sw(a)}", f"sw_dn{sw(b)}"]
                else:
                    hops = [f"sw_up{sw(a)}", f"gl_up{grp(a)}", f"gl_dn{grp(b)}", f"sw_dn{sw(b)}"]
                ctn = "".join(f'<link_ctn id="{h}"/>' for h in hops)
                lines.append(f'  <zoneRoute src="z{a}" dst="z{b}" gw_src="gw{a}" gw_dst="gw{b}" '
                             f'symmetrical="NO">{ctn}</zoneRoute>')
    else:
        # Non-blocking fat tree: leaf + spine + leaf, never a bottleneck (FATPIPE).
        link(lines, "core", p["nic_bw"] * p["nics_per_node"] * max(nodes, 1),
             3 * p["switch_hop_lat"], "FATPIPE")
        for a in range(nodes):
            for b in range(nodes):
                if a != b:
                    lines.append(f'  <zoneRoute src="z{a}" dst="z{b}" gw_src="gw{a}" gw_dst="gw{b}" '
                                 f'symmetrical="NO"><link_ctn id="core"/></zoneRoute>')
    lines += ["</zone>", "</platform>", ""]
    return "\n".join(lines)


def hostfile_for(nodes, gpus=8):
    return "".join(f"n{n}g{j}\n" for n in range(nodes) for j in range(gpus))


def main(argv):
    if len(argv) != 4 or argv[1] not in ("frontier", "dgx-h100"):
        sys.exit("usage: gen_platform.py frontier|dgx-h100 NODES OUT.xml (also writes OUT.hosts)")
    try:
        nodes = int(argv[2])
    except ValueError:
        sys.exit(f"gen_platform.py: NODES '{argv[2]}' is not an integer")
    if not 1 <= nodes <= 1024:
        sys.exit(f"gen_platform.py: NODES {nodes} must be in [1, 1024]")
    with open(argv[3], "w") as f:
        f.write(platform(argv[1], nodes))
    with open(argv[3].removesuffix(".xml") + ".hosts", "w") as f:
        f.write(hostfile_for(nodes))


if __name__ == "__main__":
    main(sys.argv)
