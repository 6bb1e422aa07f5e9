"""The GPU path (SIMT shim: the .cu kernels on the CPU) against the CPU path of the same run: the
logged quantities and the final weights within stated bounds, because the CUDA kernels reduce in
other orders than the CPU kernels (rmsnorm's dw over rows, attention over 32-key tiles, the
gradient norm over grid partials, SwiGLU's scalar exp against the CPU's vector one); everything
else is the same arithmetic. Prints the worst differences; exit 1 past a bound.
Usage: device_close.py WORK A B METRIC_REL_BOUND WEIGHT_BOUND [QUANTITIES]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_files  # noqa: E402

work, a, b = sys.argv[1:4]
metric_bound, weight_bound = float(sys.argv[4]), float(sys.argv[5])
qs = (sys.argv[6] if len(sys.argv) > 6 else "loss,ce_loss,aux_loss,grad_norm,val_loss").split(",")
steps = lambda n: {r["step"]: r for r in run_files.metrics(work, n) if "step" in r and "loss" in r}
sa, sb = steps(a), steps(b)
common = sorted(sa.keys() & sb.keys())  # a resumed run logs only the steps after its checkpoint
m = run_files.worst_metrics([sa[s] for s in common], [sb[s] for s in common], qs) if common else float("inf")
w = run_files.worst_weights(run_files.weights(work, a)[0], run_files.weights(work, b)[0])
ok = m <= metric_bound and w <= weight_bound
print(f"  {a} vs {b}: {len(common)} common steps, worst relative difference of {','.join(qs)} {m:.2e} (bound {metric_bound:g}), "
      f"of the final weights {w:.2e} (bound {weight_bound:g})")
sys.exit(0 if ok else 1)
