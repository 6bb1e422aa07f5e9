#!/usr/bin/env python3
"""The PyTorch peer of `moetrain bench moe-layer`: a dropless MoE layer (softmax router, top-k,
tokens sorted by expert, SwiGLU experts, weighted combine), forward + backward, timed on the same
device and shapes. Experts run through torch._grouped_mm when this torch has it (bf16 on a GPU;
what torchtitan uses), else a loop over experts (Megatron's legacy sequential path).
Prints one JSON object: median ms of forward+backward, useful GFLOP/s, and the same run's dense
n^3 matmul rate in the same dtype.
  python3 scripts/torch_moe_layer.py --tokens 4096 --hidden 1024 --experts 64 --topk 6 --ffn 704 \
      --device cuda --dtype bf16
"""
import argparse
import json
import time

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, warmup, iters):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gemm-n", type=int, default=4096)
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    T, H, E, k, F = a.tokens, a.hidden, a.experts, a.topk, a.ffn
    g = torch.Generator(device="cpu").manual_seed(1)

    def param(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(dev).requires_grad_(True)

    x = torch.randn(T, H, generator=g).to(dev).requires_grad_(True)
    dy = torch.randn(T, H, generator=g).to(dev)
    gate = param(E, H)
    wg, wu, wd = param(E, F, H), param(E, F, H), param(E, H, F)
    grouped = hasattr(torch, "_grouped_mm") and dev.type == "cuda" and dt == torch.bfloat16
    # The loop path keeps one leaf tensor per expert, as a PyTorch MoE holds its experts (HF's
    # nn.ModuleList, Megatron's SequentialMLP). Indexing the stacked [E,F,H] tensor instead makes
    # autograd build a full-size zero gradient for every wg[e] (select_backward): E x 3 stacks of
    # E*F*H floats zeroed per step, most of the step at E64 and slower than any MoE layer is.
    if not grouped:
        experts = [[w[e].detach().clone().requires_grad_(True) for e in range(E)] for w in (wg, wu, wd)]
    leaves = (x, gate, wg, wu, wd) if grouped else (x, gate, *experts[0], *experts[1], *experts[2])

    def layer():
        # router in fp32 (as moetrain), experts in dt
        scores = torch.softmax(x.float() @ gate.float().t(), dim=-1)
        w, idx = torch.topk(scores, k, dim=-1)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        rows = x.to(dt)[order // k]
        if grouped:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            gg = torch._grouped_mm(rows, wg.to(dt).transpose(1, 2), offs=offs)
            uu = torch._grouped_mm(rows, wu.to(dt).transpose(1, 2), offs=offs)
            hh = torch.nn.functional.silu(gg) * uu
            out_rows = torch._grouped_mm(hh, wd.to(dt).transpose(1, 2), offs=offs)
        else:
            # split, not a slice per expert: a slice's backward zero-fills a gradient the size of
            # all rows for each expert (E fills and adds of T*k*H floats); split's is one cat.
            outs = []
            for e, r in enumerate(rows.split(counts.tolist())):
                if r.shape[0] == 0:
                    continue
                eg, eu, ed = experts[0][e], experts[1][e], experts[2][e]
                h = torch.nn.functional.silu(r @ eg.to(dt).t()) * (r @ eu.to(dt).t())
                outs.append(h @ ed.to(dt).t())
            out_rows = torch.cat(outs)
        weighted = out_rows.float() * w.reshape(-1)[order].unsqueeze(1)
        y = torch.zeros(T, H, device=dev, dtype=torch.float32)
        y.index_add_(0, order // k, weighted)
        return y

    def step():
        for p in leaves:
            p.grad = None
        y = layer()
        y.backward(dy)

    sec = timed(step, dev, a.warmup, a.iters)
    useful = 2.0 * T * H * E * 3.0 + 18.0 * T * k * H * F
    n = a.gemm_n
    ga = torch.randn(n, n, generator=g).to(dev).to(dt)
    gb = torch.randn(n, n, generator=g).to(dev).to(dt)
    gsec = timed(lambda: ga @ gb, dev, 2, 5)
    print(json.dumps({
        "peer": "pytorch " + torch.__version__,
        "experts_path": "torch._grouped_mm" if grouped else "loop over experts",
        "device": a.device, "dtype": a.dtype,
        "tokens": T, "hidden": H, "experts": E, "topk": k, "ffn": F,
        "total_ms": sec * 1e3, "gflops_layer": useful / sec * 1e-9,
        "gemm_n": n, "gemm_gflops": 2.0 * n ** 3 / gsec * 1e-9,
    }))


if __name__ == "__main__":
    main()
