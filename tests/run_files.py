"""Reading the files of `moetrain train` runs in the layout tests (tests/tp.sh, tests/zero1.sh):
metrics.jsonl lines, model.safetensors tensors, and the relative differences they are judged by."""
import json
import os
import struct


def metrics(work, name):
    """Every line of WORK/NAME/metrics.jsonl, parsed."""
    with open(os.path.join(work, name, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f]


def weights(work, name):
    """WORK/NAME/model.safetensors: ({tensor: floats}, {tensor: shape}). The format: an 8-byte
    header length, a JSON header, float32 data."""
    with open(os.path.join(work, name, "model.safetensors"), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    values, shapes = {}, {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (name, k, v["dtype"])
        b, e = v["data_offsets"]
        values[k] = struct.unpack(f"<{(e - b) // 4}f", raw[8 + n + b:8 + n + e])
        shapes[k] = v["shape"]
    return values, shapes


def same_weights_file(work, a, b):
    """Whether two runs' model.safetensors are the same bytes."""
    read = lambda n: open(os.path.join(work, n, "model.safetensors"), "rb").read()
    return read(a) == read(b)


def rel(a, b):
    """|a - b| / |b|; a NaN on either side counts as an infinite difference."""
    d = abs(a - b) / abs(b) if b != 0 else (0.0 if a == 0 else float("inf"))
    return d if d == d else float("inf")


def worst_metrics(got, ref, qs):
    """The largest relative difference of the quantities qs over every step (inf when the runs
    log different steps or a quantity on one side only)."""
    if len(got) != len(ref):
        return float("inf")
    w = 0.0
    for g, r in zip(got, ref):
        if g["step"] != r["step"]:
            return float("inf")
        for q in qs:
            if (q in g) != (q in r):
                return float("inf")
            if q in r:
                w = max(w, rel(g[q], r[q]))
    return w


def worst_weights(a, b):
    """The largest difference of any weight, relative to its tensor's largest weight in b."""
    if a.keys() != b.keys():
        return float("inf")
    w = 0.0
    for k in a:
        scale = max(abs(x) for x in b[k]) or 1.0
        w = max(w, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
    return w


def bits_equal(a, b, qs):
    """The quantities qs are the same bits at every step."""
    return len(a) == len(b) and all(x.get(q) == y.get(q) for x, y in zip(a, b) for q in qs)


class Checks:
    """ok/FAIL lines and their tally; exit_code() is 1 when any failed."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, msg):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(("ok   " if ok else "FAIL ") + msg)

    def exit_code(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
