#!/usr/bin/env python3
"""Eager PyTorch training speed of a moetrain model: the independent reference implementation
(tests/reference/deepseek_ref.py: Hugging Face DeepSeek-MoE math, per-expert loop as in HF's
modeling_deepseek, autograd for backward) trained with torch.optim.AdamW on the same config, batch
and schedule as `moetrain train`. Prints one JSON object: median step seconds and tokens/s.
  /usr/bin/python3 scripts/torch_train_model.py RUN_DIR/config.json --steps 20 --batch 16 --seq-len 128
--autocast-bf16 runs the forward under torch.autocast (bf16 GEMM inputs), the peer of
moetrain --precision bf16. Run it with OPENBLAS_CORETYPE (PyTorch links the same OpenBLAS), OPENBLAS_NUM_THREADS=1 and
OMP_NUM_THREADS=1 for one thread (scripts/torch_train_compare.sh does).
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import deepseek_ref as ref  # noqa: E402


def init_weights(cfg, g):
    """Normal(0, 0.02) matrices, ones for the norms (moetrain's init; the timing does not depend on it)."""
    w = {}
    for name, shape in cfg.param_shapes().items():
        w[name] = torch.ones(shape) if len(shape) == 1 else torch.randn(*shape, generator=g) * 0.02
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="forward under torch.autocast('cpu', bfloat16): GEMM inputs in bf16 (oneDNN), "
                         "fp32 master weights and AdamW, as moetrain --precision bf16")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(a.config) as f:
        cfg = ref.Config(json.load(f))
    if cfg.topk_method == "noaux_tc":
        sys.exit(f"{a.config}: topk_method noaux_tc is not supported by this timing script")
    g = torch.Generator().manual_seed(1)
    weights = init_weights(cfg, g)
    names = list(weights)
    P = ref.make_params(weights, names, torch.float32)
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    sched = {"lr": a.lr, "min_lr": a.min_lr, "warmup_steps": a.warmup_steps, "total_steps": a.steps}
    times, losses = [], []
    for s in range(a.steps):
        tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.seq_len + 1), generator=g, dtype=torch.int32)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
            _, loss, _, _, _ = ref.forward(P, cfg, tokens)
        loss.backward()
        for p in P.values():  # an expert without tokens has a zero gradient (as in moetrain)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), a.grad_clip)
        for group in opt.param_groups:
            group["lr"] = ref.lr_at(s, sched)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    med = sorted(times)[len(times) // 2]
    peer = "pytorch " + torch.__version__ + " eager" + (" bf16 autocast" if a.autocast_bf16 else "")
    print(json.dumps({"peer": peer + " (tests/reference/deepseek_ref.py)",
                      "threads": torch.get_num_threads(), "steps": a.steps,
                      "batch": a.batch, "seq_len": a.seq_len, "median_step_s": med,
                      "tokens_per_s": a.batch * a.seq_len / med, "first_loss": losses[0],
                      "last_loss": losses[-1]}))


if __name__ == "__main__":
    main()
