#!/usr/bin/env python3
"""Edits a Hugging Face model folder (config.json + one model.safetensors) into a new folder, for
the --init-from tests. Pure Python (struct/json): no numpy or safetensors package needed.

Usage: hf_folder_edit.py SRC DST OP [ARGS]
  dtype BF16|F16        every tensor converted (round to nearest even)
  drop NAME             the tensor removed
  extra NAME            a tensor [4] of zeros added
  shape NAME            the tensor's shape given as [numel] (same bytes, wrong shape)
  retype NAME           the tensor's dtype given as I32 (same bytes, wrong dtype)
  bias VALUE [SHAPE_E]  a noaux model's e_score_correction_bias for every MoE layer: expert 0 gets
                        VALUE, the others 0 (SHAPE_E: length of the vector, default n_routed_experts)
"""
import json
import os
import shutil
import struct
import sys

SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4}


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {}
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        tensors[name] = [t["dtype"], list(t["shape"]), data[b:e]]
    return tensors, meta


def write(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32_to_bf16(blob):
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", blob):
        u += 0x7FFF + ((u >> 16) & 1)  # round to nearest even (finite weights only)
        out += struct.pack("<H", (u >> 16) & 0xFFFF)
    return bytes(out)


def f32_to_f16(blob):
    return b"".join(struct.pack("<e", x) for (x,) in struct.iter_unpack("<f", blob))


def main():
    src, dst, op, *args = sys.argv[1:]
    tensors, meta = read(os.path.join(src, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    if op == "dtype":
        conv = {"BF16": f32_to_bf16, "F16": f32_to_f16}[args[0]]
        for t in tensors.values():
            assert t[0] == "F32"
            t[0], t[2] = args[0], conv(t[2])
    elif op == "drop":
        del tensors[args[0]]
    elif op == "extra":
        tensors[args[0]] = ["F32", [4], bytes(16)]
    elif op == "shape":
        t = tensors[args[0]]
        t[1] = [len(t[2]) // SIZE[t[0]]]
    elif op == "retype":
        tensors[args[0]][0] = "I32"
    elif op == "bias":
        E = int(args[1]) if len(args) > 1 else cfg["n_routed_experts"]
        vec = struct.pack("<f", float(args[0])) + bytes(4 * (E - 1))
        first, freq = cfg.get("first_k_dense_replace", 0), cfg.get("moe_layer_freq", 1)
        for l in range(cfg["num_hidden_layers"]):
            if l >= first and l % freq == 0:
                tensors[f"model.layers.{l}.mlp.gate.e_score_correction_bias"] = ["F32", [E], vec]
    else:
        sys.exit(f"unknown op {op}")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    write(os.path.join(dst, "model.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
