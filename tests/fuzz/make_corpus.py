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


# --- indexed dataset (.idx + .bin): 4 parameter bytes (vocabulary, T, B, batches), u32 LE length
# of the .idx, the .idx, then the .bin. Realistic seeds: text-like documents of a few hundred
# tokens, as tokenize writes them (one sequence per document, pointers back to back), in uint8
# (bytes) and uint16 (a BPE vocabulary); and the hostile layouts the reader must refuse. -------
def mmidx(lengths, dtype_code, item, pointers=None, docs=None, version=1):
    S = len(lengths)
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += n * item
    if docs is None:
        docs = list(range(S + 1))
    return (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", version, dtype_code, S, len(docs)) +
            struct.pack("<%di" % S, *lengths) + struct.pack("<%dq" % S, *pointers) +
            struct.pack("<%dq" % len(docs), *docs))


def lcg_tokens(n, hi, seed):
    out, x = [], seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append((x >> 33) % hi)
    return out


def idx_seed(name, params, idx, bin_):
    put("fuzz_indexed_dataset", name, bytes(params) + struct.pack("<I", len(idx)) + idx + bin_)


verse = (b"And God said, Let there be light: and there was light. And God saw the light, that it was "
         b"good: and God divided the light from the darkness.\n")
doc_lens = [len(verse) * (1 + d % 3) for d in range(60)]  # 60 documents, ~260 bytes each
idx_seed("bytes_60_documents", [0, 31, 1, 0], mmidx(doc_lens, 1, 1),
         b"".join(verse * (1 + d % 3) for d in range(60)))
bpe_lens = [150 + (d * 37) % 200 for d in range(120)]  # 120 documents of BPE ids below 4096
idx_seed("bpe_uint16_120_documents", [4, 63, 3, 2], mmidx(bpe_lens, 8, 2),
         struct.pack("<%dH" % sum(bpe_lens), *lcg_tokens(sum(bpe_lens), 4096, 7)))
i32_lens = [64] * 40
idx_seed("int32_40_documents", [8, 15, 2, 1], mmidx(i32_lens, 4, 4),
         struct.pack("<%di" % sum(i32_lens), *lcg_tokens(sum(i32_lens), 65536, 3)))
# Megatron's layout with gaps between sequences and several sequences per document.
gap_ptrs = [i * 300 for i in range(30)]
idx_seed("gaps_and_multi_sequence_documents", [0, 15, 1, 0],
         mmidx([100] * 30, 1, 1, pointers=gap_ptrs, docs=[0] + list(range(2, 31, 2))),
         b"".join(verse[:100] + bytes(200) for _ in range(30)))
# Every sequence pointing at the same bytes (the 10^11-check .idx, scaled down).
idx_seed("bad_all_sequences_overlap", [0, 15, 1, 0], mmidx([4000] * 50, 1, 1, pointers=[0] * 50),
         bytes(lcg_tokens(4000, 256, 1)))
idx_seed("bad_out_of_order", [0, 15, 1, 0], mmidx([100, 100, 100], 1, 1, pointers=[200, 100, 0]),
         verse[:100] * 3)
idx_seed("bad_bin_short", [0, 15, 1, 0], mmidx(doc_lens[:10], 1, 1), verse * 3)
idx_seed("bad_id_above_vocab", [0, 15, 1, 0], mmidx([400], 8, 2), struct.pack("<400H", *([300] * 400)))
idx_seed("bad_float_dtype", [0, 15, 1, 0], mmidx([10], 7, 4), bytes(40))
idx_seed("bad_huge_count", [0, 15, 1, 0],
         b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, 1 << 62, 2) + bytes(64), bytes(100))

# --- tokenizer sidecar: first byte 0 = a sidecar file, 1 = a SentencePiece model file, 2 = a
# sidecar beside a 20-document byte dataset of "abc\n" each (fuzz_tokenizer_sidecar.cpp) ---------
def fingerprint(kind, vocab, model=b""):
    return "%s-%d-%s" % (kind, vocab, fnv1a64(("moetrain tokenizer\n%s\n%d\n" % (kind, vocab)).encode() + model))


def sidecar(**kw):
    s = {"format": "moetrain tokenizer sidecar 1", "kind": "bytes", "vocab_size": 256, "documents": 20,
         "split": "document d is validation iff d % 20 == 19", "train": {"tokens": 76, "bytes": 76},
         "val": {"tokens": 4, "bytes": 4}, "fingerprint": fingerprint("bytes", 256)}
    s.update(kw)
    return json.dumps(s, indent=2) + "\n"


side = lambda name, mode, text: put("fuzz_tokenizer_sidecar", name, bytes([mode]) + text.encode())
side("valid_bytes", 0, sidecar())
side("valid_bytes_beside_dataset", 2, sidecar())
side("valid_old_no_fingerprint", 2, json.dumps({k: v for k, v in json.loads(sidecar()).items()
                                                 if k != "fingerprint"}))
side("valid_spm", 0, sidecar(kind="spm", model="ds.model", vocab_size=8000,
                             fingerprint="spm-8000-0123456789abcdef",
                             train={"tokens": 912345, "bytes": 3987654}, val={"tokens": 48012, "bytes": 209876}))
side("bad_tampered_bytes", 2, sidecar(val={"tokens": 4, "bytes": 4000}))
side("bad_counts_of_another_dataset", 2, sidecar(documents=21))
side("bad_fingerprint_of_other_kind", 0, sidecar(fingerprint=fingerprint("spm", 256)))
side("bad_fingerprint_format", 0, sidecar(fingerprint="bytes-256-XYZ"))
side("bad_model_path", 0, sidecar(kind="spm", model="../../etc/passwd", vocab_size=300))
side("bad_kind", 0, sidecar(kind="wordpiece"))
side("bad_vocab", 0, sidecar(vocab_size=2 ** 31))
side("bad_negative_count", 0, sidecar(train={"tokens": -1, "bytes": 76}))
side("bad_deep", 0, deep)


def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def piece(text, ptype=1, score=0.0):
    body = b"\x0a" + varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
    if ptype != 1:
        body += b"\x18" + varint(ptype)
    return b"\x0a" + varint(len(body)) + body


# A SentencePiece ModelProto as train_bpe writes it, in miniature: <unk>, the 256 byte pieces,
# merges with U+2581 for spaces, and a trainer_spec field the reader skips.
model = piece(b"<unk>", 2) + b"".join(piece(b"<0x%02X>" % i, 6) for i in range(256))
model += b"".join(piece(w.encode(), 1, -i) for i, w in enumerate(
    ["th", "the", "\u2581the", "\u2581and", "ing", "\u2581of", "\u2581\u2581", "LORD", "\u2581God"]))
model += b"\x12" + varint(6) + b"\x08\x01\x10\x02\x18\x03"
put("fuzz_tokenizer_sidecar", "valid_model", b"\x01" + model)
put("fuzz_tokenizer_sidecar", "bad_model_truncated", b"\x01" + model[:777])
put("fuzz_tokenizer_sidecar", "bad_model_huge_length", b"\x01\x0a\xff\xff\xff\xff\x0f")
put("fuzz_tokenizer_sidecar", "bad_model_wire_type", b"\x01\x0f\x00")
