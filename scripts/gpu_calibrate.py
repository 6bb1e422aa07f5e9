#!/usr/bin/env python3
"""Measures one NVIDIA GPU for the planner and writes a cluster profile (profile.json format).

moetrain's trainer runs on CPUs; its planner also plans GPU clusters, whose presets (frontier,
dgx-h100) carry roofline GEMM and attention tables from published peaks. This script replaces
those tables with measured ones on a real GPU, through PyTorch (cuBLAS GEMMs, fused
scaled-dot-product attention), in bf16 with fp32 accumulation as mixed-precision training runs:

  - GEMM throughput on the profile's (m, n, k) grid for the three forms the time model uses
    (nt: X·Wᵀ forward, nn: dY·W backward data, tn: dYᵀ·X backward weights);
  - causal attention forward and backward per (sequence, head) on a (seq_len, head_dim) grid,
    as throughput over the nominal 4·T²·hd (forward) and 8·T²·hd (backward) FLOPs;
  - HBM bandwidth (device-to-device copy), which sets the memory-bound work and the optimizer;
  - the GPU's memory (hbm_bytes).

Everything else (links, NICs, nodes, the published peak that MFU refers to) comes from --base,
a profile written by `moetrain plan --cluster dgx-h100 --save-cluster base.json`: one GPU has no
network to measure. Usage (on the GPU machine):

  python3 scripts/gpu_calibrate.py --base base.json --out h200.json [--name dgx-h200] [--quick]
  python3 scripts/gpu_calibrate.py --shapes nt:512x2048x7168,tn:2048x7168x512   # time shapes only
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, min_seconds=0.02, max_reps=200):
    """Mean seconds of fn() over enough repetitions to fill min_seconds (CUDA events)."""
    fn()  # warm-up (and cuBLAS heuristics / kernel selection)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end) * 1e-3, 1e-7)
    reps = int(min(max_reps, max(1, math.ceil(min_seconds / one))))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps


def pow_grid(lo, hi, step=4):
    g, v = [], lo
    while v <= hi:
        g.append(float(v))
        v *= step
    return g


def gemm_table(form, m_grid, n_grid, k_grid, cap_elems):
    """GFLOP/s of C[m,n] = op(A)·op(B) in bf16 for every (m, n, k) of the grids."""
    out = []
    for m in m_grid:
        for n in n_grid:
            for k in k_grid:
                mi, ni, ki = int(m), int(n), int(k)
                if max(mi * ki, ki * ni, mi * ni) > cap_elems:
                    out.append(None)  # too big to hold: filled from the nearest measured shape
                    continue
                if form == "nt":
                    a = torch.randn(mi, ki, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(ni, ki, device="cuda", dtype=torch.bfloat16)
                    fn = lambda: torch.matmul(a, b.t())
                elif form == "nn":
                    a = torch.randn(mi, ki, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(ki, ni, device="cuda", dtype=torch.bfloat16)
                    fn = lambda: torch.matmul(a, b)
                else:  # tn
                    a = torch.randn(ki, mi, device="cuda", dtype=torch.bfloat16)
                    b = torch.randn(ki, ni, device="cuda", dtype=torch.bfloat16)
                    fn = lambda: torch.matmul(a.t(), b)
                s = timed(fn)
                out.append(2.0 * m * n * k / s * 1e-9)
                del a, b
                if max(mi * ki, ki * ni, mi * ni) >= (1 << 28):
                    torch.cuda.empty_cache()
    # Shapes skipped for memory take the rate of the largest measured shape (the plateau).
    plateau = max(v for v in out if v is not None)
    return {"m": m_grid, "n": n_grid, "k": k_grid, "gflops": [plateau if v is None else v for v in out]}


def attention_table(t_grid, hd_grid, work_elems):
    fwd, bwd = [], []
    for T in t_grid:
        for hd in hd_grid:
            Ti, hdi = int(T), int(hd)
            # (batch x heads) sequences so that one call has enough work to fill the GPU
            bh = max(1, int(work_elems // (Ti * hdi)))
            heads = min(bh, 16)
            batch = max(1, bh // heads)
            shape = (batch, heads, Ti, hdi)
            q = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

            def f():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fb():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y.backward(dy)

            try:
                sf = timed(f)
                sfb = timed(fb)
                n = batch * heads
                sb = max(sfb - sf, 1e-9)
                fwd.append(4.0 * T * T * hd * n / sf * 1e-9)
                bwd.append(8.0 * T * T * hd * n / sb * 1e-9)
            except RuntimeError as e:  # no fused kernel for this shape: the previous head_dim's rate
                print(f"attention T={Ti} hd={hdi}: {str(e).splitlines()[0]}; using the previous rate",
                      flush=True)
                fwd.append(fwd[-1] if fwd else 1.0)
                bwd.append(bwd[-1] if bwd else 1.0)
            del q, k, v, dy
            torch.cuda.empty_cache()
    return {"seq_len": t_grid, "head_dim": hd_grid, "fwd_gflops": fwd, "bwd_gflops": bwd}


def hbm_bandwidth():
    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB per side
    a = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    s = timed(lambda: b.copy_(a), min_seconds=0.2)
    return 2.0 * a.numel() * a.element_size() / s  # bytes read + written per second


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=None,
                    help="FORM:MxNxK,... : time these GEMMs directly (TFLOP/s, one JSON line each) and stop")
    ap.add_argument("--base", help="profile.json to start from (links, NICs, peak)")
    ap.add_argument("--out", help="profile.json to write")
    ap.add_argument("--name", default=None, help="cluster name (default: the base's + '-measured')")
    ap.add_argument("--grid-step", type=int, default=4, choices=[2, 4],
                    help="GEMM grid: powers of this from 16 to 65536 (2: 13³ shapes per form, ~4 min)")
    ap.add_argument("--quick", action="store_true", help="small grids (a smoke test)")
    o = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_calibrate: no CUDA device visible to PyTorch")
    if o.shapes:
        for item in o.shapes.split(","):
            form, dims = item.split(":")
            m, n, k = (float(v) for v in dims.split("x"))
            t = gemm_table(form, [m], [n], [k], 1 << 40)  # this shape alone
            t = {"form": form, "m": m, "n": n, "k": k, "tflops": t["gflops"][0] / 1e3}
            print(json.dumps(t), flush=True)
        return
    if not o.base or not o.out:
        sys.exit("gpu_calibrate: --base and --out are needed (or --shapes)")
    with open(o.base) as f:
        p = json.load(f)
    props = torch.cuda.get_device_properties(0)
    t0 = time.time()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    grid = pow_grid(16, 1024 if o.quick else 65536, o.grid_step)
    cap = (1 << 20) if o.quick else (1 << 32)  # largest operand: 4 Gi elements = 8 GiB bf16
    gemm = {}
    for form in ("nt", "nn", "tn"):
        gemm[form] = gemm_table(form, grid, grid, grid, cap)
        print(f"gemm {form}: {len(gemm[form]['gflops'])} shapes, best "
              f"{max(gemm[form]['gflops']) / 1e3:.0f} TFLOP/s ({time.time() - t0:.0f} s)", flush=True)
    t_grid = pow_grid(256, 4096 if o.quick else 65536)
    hd_grid = [32.0, 64.0, 128.0, 256.0]
    att = attention_table(t_grid, hd_grid, (1 << 22) if o.quick else (1 << 27))
    print(f"attention: best fwd {max(att['fwd_gflops']) / 1e3:.0f}, bwd {max(att['bwd_gflops']) / 1e3:.0f} "
          f"TFLOP/s nominal ({time.time() - t0:.0f} s)", flush=True)
    bw = hbm_bandwidth()
    print(f"HBM: {bw / 1e12:.2f} TB/s (copy, read + write)", flush=True)

    old_bw = p["mem_bandwidth"]
    base_name = p["name"]
    p["name"] = o.name or (p["name"] + "-measured")
    p["gemm"] = gemm
    p["attention"] = att
    p["fused_attention"] = True
    p["mem_bandwidth"] = bw
    p["hbm_bytes"] = float(props.total_memory)
    # Memory-bound work and the optimizer scale with the measured bandwidth (same byte counts).
    for key in ("fwd", "bwd"):
        p["elementwise"][key]["y"] = [y * old_bw / bw for y in p["elementwise"][key]["y"]]
    p["optimizer_s_per_param"] *= old_bw / bw
    p["notes"] = (f"GEMM/attention tables and HBM bandwidth measured on one {props.name} "
                  f"({props.multi_processor_count} SMs, torch {torch.__version__}, bf16, "
                  f"scripts/gpu_calibrate.py); peak, links and NICs from the {base_name} profile")
    with open(o.out + ".tmp", "w") as f:
        json.dump(p, f, indent=1)
    import os
    os.replace(o.out + ".tmp", o.out)
    print(f"wrote {o.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
