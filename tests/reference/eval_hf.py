"""Evaluates an exported Hugging Face folder with the independent PyTorch model.

Usage: eval_hf.py HF_DIR BATCH.safetensors  -- loads config.json and model.safetensors (or the
shards named by model.safetensors.index.json), computes the loss of BATCH's "tokens" and compares
it with BATCH's "loss" (total, written by tests/tool_eval_loss from a checkpoint) or "ce" (the
mean cross-entropy over every window, written by `moetrain eval --dump`: the trainer's held-out
figure); relative error <= 1e-5.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref  # noqa: E402
from deepseek_ref import Config, bias_name, forward, load_safetensors  # noqa: E402


def load_hf(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_safetensors(os.path.join(d, "model.safetensors"))[0]
    weights = {}
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    for name in files:
        weights.update(load_safetensors(os.path.join(d, name))[0])
    return weights


def main():
    d, batch_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    global Config, forward
    with open(os.path.join(d, "config.json")) as f:
        raw = json.load(f)
    if raw.get("model_type") in hf_moe_ref.FAMILIES:  # Mixtral, Qwen2-MoE, Qwen3-MoE
        Config, forward = hf_moe_ref.Config, hf_moe_ref.forward
    cfg = Config(raw)
    weights = load_hf(d)
    # noaux_tc: the routers' selection biases (e_score_correction_bias), state beside the weights.
    biases = {}
    if cfg.topk_method == "noaux_tc":
        for i in range(cfg.num_layers):
            if cfg.is_moe_layer(i):
                n = bias_name(f"model.layers.{i}.mlp.")
                if n not in weights:
                    print(f"{d}: the selection bias {n} is missing")
                    return 1
                biases[n] = weights.pop(n)
    missing = set(cfg.param_shapes()) - set(weights)
    extra = set(weights) - set(cfg.param_shapes())
    if missing or extra:
        print(f"{d}: missing {sorted(missing)[:3]} extra {sorted(extra)[:3]}")
        return 1
    batch = load_safetensors(batch_path)[0]
    with torch.no_grad():
        if "ce" in batch:  # every window has T targets: the mean over windows is the mean over tokens
            tokens = batch["tokens"]
            ces = [forward(weights, cfg, tokens[i:i + 16], biases)[2] for i in range(0, tokens.shape[0], 16)]
            sizes = [min(16, tokens.shape[0] - i) for i in range(0, tokens.shape[0], 16)]
            loss = sum(float(c) * n for c, n in zip(ces, sizes)) / tokens.shape[0]
            want = float(batch["ce"][0])
        else:
            _, loss, _, _, _ = forward(weights, cfg, batch["tokens"], biases)
            want = float(batch["loss"][0])
    err = abs(float(loss) - want) / abs(want)
    ok = err <= 1e-5
    print(f"{d}: torch loss {float(loss):.7f}, C++ {want:.7f}, relative error {err:.2e} "
          f"{'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
