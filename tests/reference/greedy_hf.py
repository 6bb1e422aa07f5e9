"""Greedy decoding of an exported Hugging Face folder with the independent PyTorch model.

Usage: greedy_hf.py HF_DIR IDS  -- IDS is the file `moetrain generate --ids --temperature 0`
printed: the prompt's token ids, then the new ones, on one line; --prompt-len says how many of
them are the prompt. The PyTorch model (forward of
deepseek_ref.py, the whole sequence recomputed at every step: no cache) continues the prompt
greedily for as many tokens and must choose the same token at every step. The margin between the
best and second-best logit is printed, so a mismatch at a near-tie is told from a real one.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepseek_ref import Config, forward  # noqa: E402
from eval_hf import load_hf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("ids")
    ap.add_argument("--prompt-len", type=int, required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(a.hf_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    weights = load_hf(a.hf_dir)
    with open(a.ids) as f:
        ids = [int(x) for x in f.readline().split()]
    prompt, cpp_new = ids[:a.prompt_len], ids[a.prompt_len:]
    if len(prompt) != a.prompt_len or not cpp_new:
        print(f"{a.ids}: expected {a.prompt_len} prompt ids and at least one new id, got {len(ids)} ids")
        return 1
    seq = list(prompt)
    min_margin = float("inf")
    with torch.no_grad():
        for step, want in enumerate(cpp_new):
            tokens = torch.tensor([seq + [0]], dtype=torch.int32)  # the last id is a dummy target
            logits = forward(weights, cfg, tokens)[0][0, -1]
            top = torch.topk(logits, 2)
            margin = float(top.values[0] - top.values[1])
            got = int(torch.argmax(logits))
            if got != want:
                print(f"step {step} (position {len(seq)}): torch chose {got}, C++ {want}; "
                      f"torch margin {margin:.3e} FAIL")
                return 1
            min_margin = min(min_margin, margin)
            seq.append(got)
    print(f"{a.hf_dir}: greedy {len(cpp_new)} tokens after a {len(prompt)}-token prompt equal token "
          f"for token (smallest top-1 margin {min_margin:.3e}) ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
