#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (small valid and
invalid files; rerun after changing it). Safetensors seeds are built here byte by byte, so the
seeds do not depend on the code under test."""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- safetensors: u64 LE header length, JSON header, data section -------------------------------
def st(header, data=b"", pad=True, length=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h) if length is None else length) + h + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("fuzz_safetensors", "valid_two_tensors", st(
    {"__metadata__": {"format": "pt"},
     "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
     "b": {"dtype": "I32", "shape": [3], "data_offsets": [16, 28]}},
    f32(1, 2, 3, 4) + struct.pack("<3i", 7, 8, 9)))
put("fuzz_safetensors", "valid_scalar_and_empty", st(
    {"s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
     "e": {"dtype": "BF16", "shape": [0, 5], "data_offsets": [8, 8]},
     "u": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}},
    struct.pack("<d", 1.5) + b"xyz"))
put("fuzz_safetensors", "valid_empty_header", st({}))
put("fuzz_safetensors", "bad_overlap", st(
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
     "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32(1, 2, 3)))
put("fuzz_safetensors", "bad_out_of_bounds", st(
    {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, f32(1, 2)))
put("fuzz_safetensors", "bad_shape_mismatch", st(
    {"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}, f32(1, 2)))
put("fuzz_safetensors", "bad_dtype", st(
    {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16)))
put("fuzz_safetensors", "bad_header_length", st({"a": {}}, length=1 << 40))
put("fuzz_safetensors", "bad_json", struct.pack("<Q", 8) + b'{"a":[1,')
put("fuzz_safetensors", "bad_short", b"\x05\x00\x00")

# --- config.json ---------------------------------------------------------------------------------
moe = {"model_type": "deepseek", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 3,
       "num_attention_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16,
       "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
       "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": False,
       "scoring_func": "softmax", "aux_loss_alpha": 0.01, "seq_aux": False, "rope_theta": 10000.0,
       "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "num_key_value_heads": 4,
       "hidden_act": "silu", "tie_word_embeddings": False}
put("fuzz_config", "valid_moe.json", json.dumps(moe, indent=1))
dense = {"vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 48}
put("fuzz_config", "valid_dense.json", json.dumps(dense))
put("fuzz_config", "bad_k_gt_e.json", json.dumps({**moe, "num_experts_per_tok": 9}))
put("fuzz_config", "bad_type.json", json.dumps({**moe, "n_routed_experts": "eight"}))
put("fuzz_config", "bad_missing.json", json.dumps({k: v for k, v in moe.items() if k != "hidden_size"}))
put("fuzz_config", "bad_float_int.json", json.dumps({**moe, "hidden_size": 32.5}))
put("fuzz_config", "bad_huge.json", json.dumps({**moe, "hidden_size": 1e300}))
put("fuzz_config", "bad_array.json", "[1, 2, 3]")
put("fuzz_config", "bad_truncated.json", '{"hidden_size": 32,')

# --- dataset: 4 parameter bytes (block bytes, T, B, batches), then the file -------------------
text = b"In the beginning God created the heaven and the earth.\n"
put("fuzz_dataset", "text_default_blocks", bytes([0, 15, 1, 0]) + text * 40)
put("fuzz_dataset", "text_small_blocks", bytes([9, 7, 3, 2]) + text * 12)
put("fuzz_dataset", "binary", bytes([1, 3, 0, 0]) + bytes(range(256)) * 3)
put("fuzz_dataset", "too_short", bytes([0, 63, 3, 2]) + b"short")
put("fuzz_dataset", "empty_file", bytes([0, 1, 0, 0]))


# --- the planner: first byte 0 = Hugging Face config.json, 1 = cluster profile ------------------
def plan_config(name, c):
    put("fuzz_plan", name, b"\x00" + json.dumps(c).encode())


plan_config("valid_deepseek_v3", {
    "model_type": "deepseek_v3", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 16,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": 32, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
    "max_position_embeddings": 512})
plan_config("valid_deepseek_v2_lite", {
    "model_type": "deepseek_v2", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 16,
    "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "q_lora_rank": None, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8})
plan_config("valid_mixtral", {
    "model_type": "mixtral", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 4096})
plan_config("valid_qwen2_moe", {
    "model_type": "qwen2_moe", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 64, "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0]})
plan_config("valid_deepseek", {
    "model_type": "deepseek", "vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1})
plan_config("bad_llama", {"model_type": "llama", "hidden_size": 64})
plan_config("bad_mixtral_k", {
    "model_type": "mixtral", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 128,
    "num_local_experts": 2, "num_experts_per_tok": 4})
# A cluster profile seed: the dgx-h100 preset as `moetrain plan --cluster dgx-h100 --save-cluster`
# writes it is kept as corpus/fuzz_plan/valid_profile_dgx (prefixed with byte 1); it is not
# generated here because its tables come from the code under test.


# --- deep and huge inputs for every JSON reader (the depth bound: io::check_json_depth) --------
deep = "[" * 100000 + "]" * 100000
put("fuzz_config", "bad_deep.json", deep)
put("fuzz_config", "bad_deep_object.json", '{"a":' * 300 + "1" + "}" * 300)
put("fuzz_plan", "bad_deep_config", b"\x00" + deep.encode())
put("fuzz_plan", "bad_deep_profile", b"\x01" + deep.encode())
put("fuzz_safetensors", "bad_deep_header", struct.pack("<Q", len(deep)) + deep.encode())


# --- checkpoint manifest: fuzz_checkpoint writes the bytes as step-1/manifest.json beside a real
# shard-00000.safetensors (tensor "w", F32 [2] = {1, -2}, as SafetensorsWriter writes it) ----------
def fnv1a64(b):
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


shard = st({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, f32(1, -2))
shards = {"shard-00000.safetensors": {"bytes": len(shard), "fnv1a64": fnv1a64(shard)}}
manifest = {"format": "moetrain-checkpoint-1", "step": 1, "data_rng_state": "12345", "seed": "42",
            "bad_steps": 0, "config": {"hidden_size": 32}, "parallel": {"pp": 1},
            "expert_placement": {}, "tensors": {"w": "shard-00000.safetensors"}, "shards": shards}
ck = lambda name, m: put("fuzz_checkpoint", name, json.dumps(m, indent=1))
ck("valid", manifest)
ck("valid_no_tensors", {**manifest, "tensors": {}})
ck("bad_dotdot", {**manifest, "tensors": {"w": "../outside.safetensors"},
                  "shards": {"../outside.safetensors": shards["shard-00000.safetensors"]}})
ck("bad_absolute", {**manifest, "tensors": {"w": "/etc/passwd"}})
ck("bad_tensor_name", {**manifest, "tensors": {"../../w": "shard-00000.safetensors"}})
ck("bad_empty_shards", {**manifest, "shards": {}})
ck("bad_unlisted_shard", {**manifest, "tensors": {"w": "shard-00001.safetensors"}})
ck("bad_huge_size", {**manifest, "shards": {"shard-00000.safetensors":
                                             {"bytes": 2**64 - 1, "fnv1a64": fnv1a64(shard)}}})
ck("bad_checksum", {**manifest, "shards": {"shard-00000.safetensors":
                                            {"bytes": len(shard), "fnv1a64": "0" * 16}}})
ck("bad_seed", {**manifest, "seed": "99999999999999999999999"})
ck("bad_step", {**manifest, "step": 1e300})
put("fuzz_checkpoint", "bad_deep", '{"format": "moetrain-checkpoint-1", "config": ' + deep + "}")
put("fuzz_checkpoint", "bad_truncated", json.dumps(manifest)[:200])
