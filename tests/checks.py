"""The test spine's comparisons (tests/lib.sh's counterpart in Python): one definition of "the same
losses" and "the same weights" for every test that compares runs (parity, TP, ZeRO-1, golden,
checkpoints, the cluster and the emulated device), and the pass/fail counting of the Python checks.

"The same losses" (compare_losses): the two runs' metrics.jsonl lines keyed by step (a resumed run
re-logs the steps after its checkpoint; the later line wins, as in `moetrain report`) log the same
steps (or, with common_steps, are compared on the steps both logged), each compared quantity is
logged at a step by both runs or by neither, and every value is
  rtol == 0: the same double, bit for bit (null, a skipped step, equals only null);
  rtol >  0: within rtol relative, |got - ref| / |ref| (0 when both are 0; a NaN, an infinity or a
             null on one side only is an infinite difference).
"The same weights" (compare_weights): the same tensor names and shapes, and every weight within rtol
of its tensor's largest |weight| in ref (rtol 0: the model.safetensors files are the same bytes).

Library:  import os, sys; sys.path.insert(0, os.environ["TESTS_DIR"]); import checks
    c = checks.Checks()
    c(ok, "what was checked")      # prints "ok: ..." or "FAIL: ..." and counts it
    sys.exit(c.finish())           # "P passed, F failed"; 1 when any failed
Command line (each prints one ok/FAIL line with the worst difference; exit 1 on FAIL):
  checks.py losses A B [--rtol R] [--keys K,...] [--steps FIRST-LAST | --common-steps] [--name NAME]
      A against B (the reference); A, B: run folders or metrics.jsonl files. Default keys: loss,
      ce_loss, aux_loss, grad_norm, val_loss; --steps limits both runs to those steps.
  checks.py weights A B [--rtol R] [--name NAME]        A/model.safetensors against B's
  checks.py golden GOLDEN METRICS [--rtol R] [--name NAME]
      the "step loss" lines of a golden file (tests/golden/) against a run's metrics.jsonl
"""
import argparse
import json
import math
import os
import struct
import sys

LOSSES = ("loss", "ce_loss", "aux_loss", "grad_norm", "val_loss")


class Checks:
    """ok/FAIL lines and their tally; finish() prints it and is 1 when any check failed."""

    def __init__(self, quiet_ok=False):
        self.passed = self.failed = 0
        self.quiet_ok = quiet_ok

    def __call__(self, ok, msg):
        if ok:
            self.passed += 1
            if not self.quiet_ok:
                print(f"ok: {msg}")
        else:
            self.failed += 1
            print(f"FAIL: {msg}")
        return ok

    def finish(self, name=""):
        print(f"{name + ': ' if name else ''}{self.passed} passed, {self.failed} failed")
        sys.stdout.flush()
        return 1 if self.failed else 0


# --- reading runs ---------------------------------------------------------------------------------

def metrics_path(run):
    """A run folder or its metrics.jsonl -> the metrics.jsonl path."""
    return os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run


def metrics(work, name=None):
    """Every line of WORK/NAME/metrics.jsonl (or of the run WORK), parsed, in file order."""
    path = metrics_path(os.path.join(work, name) if name is not None else work)
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def by_step(rows):
    """{step: line}, the later line of a step winning (a resumed run re-logs steps)."""
    return {r["step"]: r for r in rows}


def weights(work, name=None):
    """WORK/NAME/model.safetensors (or WORK/model.safetensors): ({tensor: floats}, {tensor: shape}).
    The format: an 8-byte header length, a JSON header, float32 data."""
    run = os.path.join(work, name) if name is not None else work
    path = os.path.join(run, "model.safetensors") if os.path.isdir(run) else run
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    values, shapes = {}, {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {k} has dtype {v['dtype']}, the comparison reads F32 only")
        b, e = v["data_offsets"]
        values[k] = struct.unpack(f"<{(e - b) // 4}f", raw[8 + n + b:8 + n + e])
        shapes[k] = v["shape"]
    return values, shapes


def same_weights_file(work, a, b):
    """Whether two runs' model.safetensors are the same bytes."""
    read = lambda n: open(os.path.join(work, n, "model.safetensors"), "rb").read()
    return read(a) == read(b)


# --- the one definition of a difference -----------------------------------------------------------

def rel(a, b):
    """|a - b| / |b|: 0 when both are equal (0, null, the same list); a NaN, an infinity, a null on
    one side or unequal non-numbers (lists) are an infinite difference."""
    if a == b:
        return 0.0
    if not all(isinstance(x, (int, float)) for x in (a, b)):  # null, a list (expert_loads), text
        return float("inf")
    d = abs(a - b) / abs(b) if b != 0 else float("inf")
    return d if math.isfinite(d) else float("inf")


def within(a, b, rtol):
    """The same value: bit for bit when rtol is 0, else within rtol relative."""
    return (a == b) if rtol == 0 else rel(a, b) <= rtol


class Result:
    """ok, the worst relative difference, and a message that says where it failed (or how close)."""

    def __init__(self, ok, worst, msg):
        self.ok, self.worst, self.msg = ok, worst, msg

    def __bool__(self):
        return self.ok


def mode(rtol):
    return "bit for bit" if rtol == 0 else f"within {rtol:g} relative"


def compare_losses(got, ref, keys=LOSSES, rtol=0.0, steps=None, common_steps=False):
    """The same losses (the module docstring): got and ref are lists of metrics lines; steps a
    (first, last) range both are limited to."""
    g, r = by_step(got), by_step(ref)
    if steps is not None:
        g = {s: v for s, v in g.items() if steps[0] <= s <= steps[1]}
        r = {s: v for s, v in r.items() if steps[0] <= s <= steps[1]}
    if common_steps:
        g = {s: v for s, v in g.items() if s in r}
        r = {s: v for s, v in r.items() if s in g}
    if not r or g.keys() != r.keys():
        return Result(False, float("inf"), f"steps differ: {sorted(g)} against {sorted(r)}")
    worst, first = 0.0, None
    for s in sorted(r):
        for k in keys:
            if (k in g[s]) != (k in r[s]):
                return Result(False, float("inf"), f"step {s}: {k} logged by only one run")
            if k not in r[s]:
                continue
            a, b = g[s][k], r[s][k]
            worst = max(worst, rel(a, b))
            if first is None and not within(a, b, rtol):
                first = (s, k, a, b)
    n = f"{len(r)} steps of {','.join(keys)}"
    if first is not None:
        s, k, a, b = first
        return Result(False, worst, f"{n}: not {mode(rtol)}, first at step {s} {k} ({a!r}, reference {b!r}); "
                                    f"worst relative difference {worst:.3e}")
    return Result(True, worst, f"{n} {mode(rtol)} (worst relative difference {worst:.3e})")


def worst_metrics(got, ref, qs):
    """The largest relative difference of the quantities qs over every step (inf when the runs
    log different steps or a quantity on one side only)."""
    return compare_losses(got, ref, qs, rtol=float("inf")).worst


def bits_equal(a, b, qs):
    """The quantities qs are the same bits at every step."""
    return compare_losses(a, b, qs, rtol=0).ok


def worst_weights(a, b):
    """The largest difference of any weight, relative to its tensor's largest |weight| in b."""
    if a.keys() != b.keys():
        return float("inf")
    w = 0.0
    for k in a:
        if len(a[k]) != len(b[k]):
            return float("inf")
        scale = max(abs(x) for x in b[k]) or 1.0
        w = max(w, max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0) / scale)
    return w if w == w else float("inf")


def compare_weights(a_run, b_run, rtol=0.0):
    """The same weights (the module docstring): runs are folders or model.safetensors paths."""
    file_of = lambda r: os.path.join(r, "model.safetensors") if os.path.isdir(r) else r
    if rtol == 0:
        same = open(file_of(a_run), "rb").read() == open(file_of(b_run), "rb").read()
        return Result(same, 0.0 if same else float("inf"),
                      "model.safetensors " + ("the same bytes" if same else "differs"))
    (wa, sa), (wb, sb) = weights(a_run), weights(b_run)
    if sa != sb:
        return Result(False, float("inf"), "the tensors or their shapes differ")
    w = worst_weights(wa, wb)
    return Result(w <= rtol, w, f"final weights {w:.3e} of their tensor's largest (bound {rtol:g})")


def golden_losses(path):
    """A golden file's "step loss" lines (after its # comments) as metrics lines."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                s, v = line.split()
                rows.append({"step": int(s), "loss": None if v == "null" else float(v)})
    return rows


# --- the command line ------------------------------------------------------------------------------

def main(argv):
    p = argparse.ArgumentParser(prog="checks.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("losses", help="A's metrics against B's")
    lo.add_argument("a")
    lo.add_argument("b")
    lo.add_argument("--keys", default=",".join(LOSSES))
    lo.add_argument("--steps", help="FIRST-LAST")
    lo.add_argument("--common-steps", action="store_true")
    we = sub.add_parser("weights", help="A's final weights against B's")
    we.add_argument("a")
    we.add_argument("b")
    go = sub.add_parser("golden", help="a run's losses against a golden file")
    go.add_argument("golden")
    go.add_argument("metrics")
    for q in (lo, we, go):
        q.add_argument("--rtol", type=float, default=0.0)
        q.add_argument("--name", default="")
    args = p.parse_args(argv)
    name = args.name + ": " if args.name else ""
    if args.cmd == "losses":
        steps = tuple(int(x) for x in args.steps.split("-")) if args.steps else None
        r = compare_losses(metrics(args.a), metrics(args.b), tuple(args.keys.split(",")), args.rtol,
                           steps, args.common_steps)
        what = f"{args.a} against {args.b}"
    elif args.cmd == "weights":
        r = compare_weights(args.a, args.b, args.rtol)
        what = f"{args.a} against {args.b}"
    else:
        r = compare_losses(metrics(args.metrics), golden_losses(args.golden), ("loss",), args.rtol)
        what = f"{args.metrics} against {args.golden}"
    print(f"{'ok' if r.ok else 'FAIL'}: {name}{what}: {r.msg}")
    return 0 if r.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
