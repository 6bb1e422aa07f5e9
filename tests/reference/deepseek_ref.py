#!/usr/bin/env python3
"""Independent PyTorch reference for moetrain's DeepSeek-MoE model.

Usage: deepseek_ref.py DUMP_DIR [--tol 1e-4] [--weight-tol T] [--dtype float32|float64]

DUMP_DIR is written by the C++ program tool_ref_dump:
  config.json           Hugging Face DeepSeek-MoE config (model_type "deepseek")
  model.safetensors     initial weights, F32, Hugging Face names
  train.json            batch, seq_len, steps, lr, min_lr, warmup_steps, total_steps, beta1, beta2,
                        eps, weight_decay, grad_clip
  batch.safetensors     "tokens" I32 [B, T+1]; "train_tokens" I32 [steps, B, T+1]
  expected.safetensors  what the C++ code computed: "logits" [B,T,V], "loss", "ce_loss",
                        "aux_loss" [1], "grad.<param>" for every parameter, "train_losses" [steps]
  final.safetensors     the weights after the `steps` AdamW steps, F32, Hugging Face names
  bias.safetensors      topk_method noaux_tc only: each MoE layer's e_score_correction_bias [E]
                        before the forward ("init.<layer gate>.e_score_correction_bias") and after
                        the training steps ("final.<...>"), each step moving it by
                        bias_update_speed * sign(mean(load) - load) over that step's loads

This file rebuilds the model from the description of the math (plain torch functions, autograd for
gradients), recomputes all of it and compares. Error of a tensor:
    error = max|cpp - torch| / max(max|torch|, 1e-12)
and every check must have error <= tol, except the final weights, which must have error <=
weight-tol: a much tighter bound, since a drift in the update (weight decay on a norm weight, a
wrong bias correction) moves the weights by ~1e-5 relative long before it shows in 10 losses at 1e-4.
Exit code 0 only if every check passes.

The safetensors files are parsed here with struct + json (not the safetensors package), so the
C++ writer is checked by an independent reader as well.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# Bound on max|cpp - torch| / max|torch| of each weight after the AdamW steps (fp32 on both sides).
# Measured worst: 5.4e-7 (test-moe), 2.2e-6 (test-moe-seqaux, embed_tokens), with tool_ref_dump's
# lr 1e-3 / eps 1e-5; a 1e-5 relative drift in any tensor fails. AdamW decaying the norm weights
# (a planted bug the 10 losses at 1e-4 do not see: 2.6e-6) gives 6.3e-4 here.
WEIGHT_TOL = 5e-6

# train.json "gemm_precision": "bf16" (moetrain --precision bf16): every GEMM of the C++ model
# rounds its two inputs to bf16 (nearest even) and accumulates in fp32, in forward and in each
# backward GEMM (dX = dY·W and dW = dY^T·X read dY, W and X rounded), except attention's score and
# value products, which stay fp32 (as the kernels' softmax does). linear() and matmul() below
# do the same here with an autograd function of their own; off, they are F.linear / torch.matmul.
GEMM_BF16 = False
# Measured with bf16 GEMM inputs on both sides (test-moe; AVX-512 BF16 CPU):
# logits, losses and gradients agree to <= 2.2e-5 (the 10 training losses; gradients <= 4e-7), so
# the fp32 bound 1e-4 stays for logits and losses (for gradients see BF16_GRAD_TOL). The weights after 10 AdamW steps differ by up to 7.6e-3 of a
# tensor's largest weight: accumulation order moves a product across a bf16 rounding boundary
# (2^-8 of one input), and Adam turns the small gradient change of a near-zero-gradient element
# into an O(lr) step. Their bound is 2e-2 (the update arithmetic itself is checked at 5e-6 by
# the fp32 cases; this one catches a broken bf16 path, e.g. a stale bf16 weight copy).
BF16_WEIGHT_TOL = 2e-2
# The gradients' bound with bf16 GEMM inputs. On a CPU whose oneDNN kernel sums in another order
# than PyTorch's (2026-12-03: AVX-512 BF16 without AMX, "avx512_core_bf16"), an fp32 activation one
# ulp away can round to the neighbouring bf16 value (2^-8 of it). A gradient tensor whose largest
# element is small against the products summed into it then moves by more than 1e-4 of that
# element: measured 6.4e-4 (layer 0 k_proj, max|grad| 4.3e-4) and 1.4e-4 (an expert's gate_proj,
# max 9.1e-5); every other gradient was within 1e-4, the logits and losses within 1e-4 too. A
# broken bf16 path (fp32 inputs on one side, a stale weight copy) is off by 1e-2 or more.
BF16_GRAD_TOL = 2e-3


def _bf16(t):
    return t.to(torch.bfloat16).to(t.dtype)


class _Bf16MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.matmul(_bf16(a), _bf16(b))

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        g = _bf16(g)
        return torch.matmul(g, _bf16(b).transpose(-1, -2)), torch.matmul(_bf16(a).transpose(-1, -2), g)


def matmul(a, b):
    return _Bf16MatMul.apply(a, b) if GEMM_BF16 else torch.matmul(a, b)


def linear(x, w):
    if not GEMM_BF16:
        return F.linear(x, w)
    y = _Bf16MatMul.apply(x.reshape(-1, x.shape[-1]), w.t())
    return y.reshape(*x.shape[:-1], w.shape[0])

# ------------------------------------------------------------------------------------------------
# safetensors, parsed by hand

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}


def load_safetensors(path):
    """Returns ({name: tensor}, metadata). Tensors are copies (own their memory)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the header length field")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        if t["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {t['dtype']}")
        begin, end = t["data_offsets"]
        dtype = _DTYPES[t["dtype"]]
        shape = list(t["shape"])
        numel = math.prod(shape)
        itemsize = torch.tensor([], dtype=dtype).element_size()
        if end - begin != numel * itemsize or end > len(data):
            raise ValueError(f"{path}: tensor {name}: offsets [{begin}, {end}] do not fit "
                             f"shape {shape} of {t['dtype']}")
        if numel == 0:
            out[name] = torch.zeros(shape, dtype=dtype)
        else:
            buf = bytearray(data[begin:end])  # writable copy: frombuffer warns on read-only memory
            out[name] = torch.frombuffer(buf, dtype=dtype).reshape(shape).clone()
    return out, metadata


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (contiguous, little-endian) in insertion order. Used by self-tests."""
    rev = {v: k for k, v in _DTYPES.items()}
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, t in tensors.items():
        b = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": rev[t.dtype], "shape": list(t.shape),
                        "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------------------------------------
# Model (Hugging Face DeepSeek-MoE, v1: softmax router, shared experts, dense first layers)

class Config:
    def __init__(self, d):
        self.raw = d
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.num_layers = int(d["num_hidden_layers"])
        self.num_heads = int(d["num_attention_heads"])
        self.num_kv_heads = int(d.get("num_key_value_heads") or self.num_heads)
        self.intermediate_size = int(d["intermediate_size"])
        self.moe_intermediate_size = int(d.get("moe_intermediate_size") or 0)
        self.n_routed_experts = d.get("n_routed_experts")
        self.n_shared_experts = int(d.get("n_shared_experts") or 0)
        self.top_k = int(d.get("num_experts_per_tok") or 0)
        self.first_k_dense_replace = int(d.get("first_k_dense_replace", 0))
        self.moe_layer_freq = int(d.get("moe_layer_freq", 1))
        self.norm_topk_prob = bool(d.get("norm_topk_prob", False))
        self.scoring_func = d.get("scoring_func", "softmax")
        self.topk_method = d.get("topk_method", "greedy")
        self.routed_scaling_factor = float(d.get("routed_scaling_factor", 1.0))
        self.n_group = int(d.get("n_group") or 1)
        self.topk_group = int(d.get("topk_group") or 1)
        self.bias_update_speed = float(d.get("bias_update_speed", 1e-3))
        self.aux_loss_alpha = float(d.get("aux_loss_alpha", 0.001))
        self.seq_aux = bool(d.get("seq_aux", True))
        self.rope_theta = float(d.get("rope_theta", 10000.0))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-6))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        # DeepSeek-V2/V3: multi-head latent attention (HF DeepseekV2Attention / DeepseekV3Attention).
        self.mla = d.get("model_type") in ("deepseek_v2", "deepseek_v3")
        self.q_lora_rank = int(d.get("q_lora_rank") or 0)
        self.kv_lora_rank = int(d.get("kv_lora_rank") or 0)
        self.qk_nope_head_dim = int(d.get("qk_nope_head_dim") or 0)
        self.qk_rope_head_dim = int(d.get("qk_rope_head_dim") or 0)
        self.v_head_dim = int(d.get("v_head_dim") or 0)
        self.rope_scaling = d.get("rope_scaling")
        self.mtp_depth = int(d.get("num_nextn_predict_layers") or 0)
        self.mtp_weight = 0.0  # train.json's
        problems = []
        if self.hidden_size % self.num_heads and not self.mla:
            problems.append(f"hidden_size {self.hidden_size} is not a multiple of "
                            f"num_attention_heads {self.num_heads}")
        if self.num_kv_heads != self.num_heads:
            problems.append("num_key_value_heads != num_attention_heads is not supported")
        if (self.scoring_func, self.topk_method) not in (
                ("softmax", "greedy"), ("softmax", "group_limited_greedy"), ("sigmoid", "noaux_tc")):
            problems.append(f"scoring_func {self.scoring_func!r} with topk_method {self.topk_method!r} "
                            "is not supported (softmax + greedy or group_limited_greedy, "
                            "or sigmoid + noaux_tc)")
        if self.n_group > 1 and self.topk_method == "greedy":
            problems.append(f"n_group {self.n_group} with topk_method 'greedy'")
        if self.n_group > 1 and (int(self.n_routed_experts) % self.n_group
                                 or not 1 <= self.topk_group <= self.n_group):
            problems.append(f"n_group {self.n_group} / topk_group {self.topk_group} do not fit "
                            f"n_routed_experts {self.n_routed_experts}")
        if self.tie_word_embeddings:
            problems.append("tie_word_embeddings = true is not supported")
        if self.rope_scaling and not (self.mla and self.rope_scaling.get("type") == "yarn"):
            problems.append("rope_scaling other than yarn (deepseek_v2/v3) is not supported")
        if d.get("attention_bias"):
            problems.append("attention_bias is not supported")
        if problems:
            raise ValueError("config.json: " + "; ".join(problems))
        self.head_dim = self.hidden_size // self.num_heads

    def is_moe_layer(self, i):
        # Hugging Face DeepseekDecoderLayer's rule.
        return (self.n_routed_experts is not None and self.n_routed_experts > 0
                and i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0)

    def layer_shapes(self, shapes, i):
        """Adds decoder layer i's {name: shape}."""
        H, I = self.hidden_size, self.intermediate_size
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = [H]
        if self.mla:
            nh, rq, rkv = self.num_heads, self.q_lora_rank, self.kv_lora_rank
            dn, dr, dv = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
            a = p + "self_attn."
            if rq:
                shapes[a + "q_a_proj.weight"] = [rq, H]
                shapes[a + "q_a_layernorm.weight"] = [rq]
                shapes[a + "q_b_proj.weight"] = [nh * (dn + dr), rq]
            else:
                shapes[a + "q_proj.weight"] = [nh * (dn + dr), H]
            shapes[a + "kv_a_proj_with_mqa.weight"] = [rkv + dr, H]
            shapes[a + "kv_a_layernorm.weight"] = [rkv]
            shapes[a + "kv_b_proj.weight"] = [nh * (dn + dv), rkv]
            shapes[a + "o_proj.weight"] = [H, nh * dv]
        else:
            for n in "qkvo":
                shapes[p + f"self_attn.{n}_proj.weight"] = [H, H]
        shapes[p + "post_attention_layernorm.weight"] = [H]
        if self.is_moe_layer(i):
            E, Fm = int(self.n_routed_experts), self.moe_intermediate_size
            shapes[p + "mlp.gate.weight"] = [E, H]
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                shapes[q + "gate_proj.weight"] = [Fm, H]
                shapes[q + "up_proj.weight"] = [Fm, H]
                shapes[q + "down_proj.weight"] = [H, Fm]
            if self.n_shared_experts > 0:
                Fs = Fm * self.n_shared_experts
                q = p + "mlp.shared_experts."
                shapes[q + "gate_proj.weight"] = [Fs, H]
                shapes[q + "up_proj.weight"] = [Fs, H]
                shapes[q + "down_proj.weight"] = [H, Fs]
        else:
            shapes[p + "mlp.gate_proj.weight"] = [I, H]
            shapes[p + "mlp.up_proj.weight"] = [I, H]
            shapes[p + "mlp.down_proj.weight"] = [H, I]

    def param_shapes(self):
        """{name: shape} of every parameter, in model order."""
        V, H, I = self.vocab_size, self.hidden_size, self.intermediate_size
        shapes = {"model.embed_tokens.weight": [V, H]}
        for i in range(self.num_layers):
            self.layer_shapes(shapes, i)
        if self.mtp_depth:
            # model.layers.L: enorm, hnorm, eh_proj, a decoder layer (layer_shapes), shared_head.norm
            # (DeepSeek-V3's checkpoint also repeats embed_tokens and shared_head.head there; they
            # are the main model's here, and moetrain does not write the copies).
            L = self.num_layers
            p = f"model.layers.{L}."
            shapes[p + "enorm.weight"] = [H]
            shapes[p + "hnorm.weight"] = [H]
            shapes[p + "eh_proj.weight"] = [H, 2 * H]
            self.layer_shapes(shapes, L)
            shapes[p + "shared_head.norm.weight"] = [H]
        shapes["model.norm.weight"] = [H]
        shapes["lm_head.weight"] = [V, H]
        return shapes


def rmsnorm(x, w, eps):
    # x * rsqrt(mean(x^2) + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def rope_cos_sin(T, d, theta, dtype):
    # inv_freq computed in float32 as Hugging Face does, angles p * inv_freq, duplicated to [T, d].
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    t = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def attention(x, P, p, cfg):
    B, T, H = x.shape
    nh, d = cfg.num_heads, cfg.head_dim
    q = linear(x, P[p + "q_proj.weight"]).view(B, T, nh, d).transpose(1, 2)  # [B, nh, T, d]
    k = linear(x, P[p + "k_proj.weight"]).view(B, T, nh, d).transpose(1, 2)
    v = linear(x, P[p + "v_proj.weight"]).view(B, T, nh, d).transpose(1, 2)
    cos, sin = rope_cos_sin(T, d, cfg.rope_theta, x.dtype)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    # Attention's products stay fp32 with bf16 GEMM inputs too (the C++ kernel's tile GEMMs are sgemm).
    att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)  # [B, nh, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
    out = torch.matmul(att, v).transpose(1, 2).reshape(B, T, H)
    return linear(out, P[p + "o_proj.weight"])


def yarn_get_mscale(scale=1.0, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_rope_cos_sin(T, cfg, dtype):
    """The rotary table of DeepSeek-V2/V3's rope columns: plain, or DeepseekV2YarnRotaryEmbedding's."""
    d, base, rs = cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling
    if not rs:
        return rope_cos_sin(T, d, base, dtype)
    factor = float(rs["factor"])
    orig = int(rs.get("original_max_position_embeddings", 4096))
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))
    mscale, mscale_all_dim = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))
    freq_extra = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freq_inter = 1.0 / (factor * base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def correction_dim(rotations):
        return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))
    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    inv_freq_mask = 1.0 - ramp
    inv_freq = freq_inter * (1 - inv_freq_mask) + freq_extra * inv_freq_mask
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    amp = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * amp).to(dtype), (emb.sin() * amp).to(dtype)


def rope_interleaved(x, cos, sin):
    # HF modeling_deepseek (V2/V3) apply_rotary_pos_emb: de-interleave the pairs, then rotate_half.
    b, h, s, d = x.shape
    x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return x * cos + rotate_half(x) * sin


def mla_attention(x, P, p, cfg):
    """DeepseekV2Attention / DeepseekV3Attention's forward (no cache, causal)."""
    B, T, H = x.shape
    nh, rkv = cfg.num_heads, cfg.kv_lora_rank
    dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if cfg.q_lora_rank:
        # The latent norms: DeepseekV2RMSNorm's default eps 1e-6.
        q = linear(rmsnorm(linear(x, P[p + "q_a_proj.weight"]), P[p + "q_a_layernorm.weight"], 1e-6),
                   P[p + "q_b_proj.weight"])
    else:
        q = linear(x, P[p + "q_proj.weight"])
    q = q.view(B, T, nh, dn + dr).transpose(1, 2)
    q_nope, q_pe = torch.split(q, [dn, dr], dim=-1)
    ckv = linear(x, P[p + "kv_a_proj_with_mqa.weight"])
    c, k_pe = torch.split(ckv, [rkv, dr], dim=-1)
    k_pe = k_pe.view(B, T, 1, dr).transpose(1, 2)
    kv = linear(rmsnorm(c, P[p + "kv_a_layernorm.weight"], 1e-6), P[p + "kv_b_proj.weight"])
    kv = kv.view(B, T, nh, dn + dv).transpose(1, 2)
    k_nope, v = torch.split(kv, [dn, dv], dim=-1)
    cos, sin = mla_rope_cos_sin(T, cfg, x.dtype)
    q_pe = rope_interleaved(q_pe, cos, sin)
    k_pe = rope_interleaved(k_pe, cos, sin)
    q = torch.cat([q_nope, q_pe], dim=-1)
    k = torch.cat([k_nope, k_pe.expand(B, nh, T, dr)], dim=-1)
    scale = (dn + dr) ** -0.5
    rs = cfg.rope_scaling
    if rs and float(rs.get("mscale_all_dim", 0)):
        m = yarn_get_mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
        scale = scale * m * m
    att = torch.matmul(q, k.transpose(2, 3)) * scale
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
    out = torch.matmul(att, v).transpose(1, 2).reshape(B, T, nh * dv)
    return linear(out, P[p + "o_proj.weight"])


def swiglu_mlp(x, P, p):
    # down(silu(gate(x)) * up(x))
    return linear(F.silu(linear(x, P[p + "gate_proj.weight"])) * linear(x, P[p + "up_proj.weight"]),
                    P[p + "down_proj.weight"])


def bias_name(p):
    return p + "gate.e_score_correction_bias"


def group_limit(choice, cfg, diag, name):
    """Group-limited routing, the torch way (HF modeling_deepseek MoEGate, DeepSeek-V2's
    group_limited_greedy and V3's noaux_tc): the experts form n_group groups of consecutive experts;
    a group's score is its max choice value (V2) or the sum of its top-2 (V3); the token keeps its
    topk_group best groups. Returns choice [N, E] with the other groups' experts at -inf (DeepSeek-V3's
    inference code; HF's remote code fills 0.0, the same whenever the kept values are >= 0)."""
    if cfg.n_group <= 1:
        return choice
    N, E = choice.shape
    grouped = choice.view(N, cfg.n_group, E // cfg.n_group)
    if cfg.topk_method == "noaux_tc":
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [N, n_group]
    else:
        group_scores = grouped.max(dim=-1).values
    group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
    if cfg.topk_group < cfg.n_group:  # a near-tie between groups can flip routing too
        top = torch.topk(group_scores, cfg.topk_group + 1, dim=-1).values
        diag["margins"].append((name + " groups", float((top[:, -2] - top[:, -1]).min())))
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
    score_mask = group_mask.unsqueeze(-1).expand(N, cfg.n_group, E // cfg.n_group).reshape(N, E)
    return choice.masked_fill(~score_mask.bool(), float("-inf"))


def moe(x, P, p, cfg, diag, biases=None, loads=None):
    """Returns (y [B,T,H], aux loss scalar). diag["margins"] collects the top-k routing margin per
    layer, diag["rerouted"] how many tokens the group limit gave other experts.
    noaux_tc (DeepSeek-V3 MoEGate): scores = sigmoid(logits); the experts are the top-k of
    scores + e_score_correction_bias (biases[bias_name(p)], no gradient); the gate values are the
    chosen unbiased scores, renormalised if norm_topk_prob, times routed_scaling_factor. With
    n_group > 1 the choice is limited to each token's topk_group best groups (group_limit). loads,
    if given, collects this layer's per-expert pair counts [E]."""
    B, T, H = x.shape
    E, k = int(cfg.n_routed_experts), cfg.top_k
    xf = x.reshape(B * T, H)
    logits = linear(xf, P[p + "gate.weight"])  # [N, E]
    if cfg.topk_method == "noaux_tc":
        if biases is None or bias_name(p) not in biases:
            raise ValueError(f"{bias_name(p)}: topk_method noaux_tc needs the selection bias "
                             "(an exported model does not carry it yet)")
        scores = logits.sigmoid()
        choice = scores.detach() + biases[bias_name(p)].to(scores.dtype).unsqueeze(0)
    else:
        scores = logits.softmax(dim=-1)
        choice = scores.detach()
    limited = group_limit(choice, cfg, diag, p + "gate")
    _, topk_idx = torch.topk(limited, k, dim=-1, sorted=True)  # [N, k]
    topk_w = scores.gather(1, topk_idx)
    if k < E:  # how close the k-th choice came to losing its place (a near-tie can flip routing)
        top = torch.topk(limited, k + 1, dim=-1).values
        diag["margins"].append((p + "gate", float((top[:, k - 1] - top[:, k]).min())))
    if cfg.n_group > 1:  # tokens whose experts the group limit changed (none: it went untested)
        free = torch.topk(choice, k, dim=-1).indices.sort(dim=-1).values
        moved = int((free != topk_idx.sort(dim=-1).values).any(dim=-1).sum())
        diag["rerouted"].append((p + "gate", moved, B * T))
    # routed_scaling_factor: V3 (noaux_tc) scales always; V2 (softmax) only weights it does not
    # renormalise (HF modeling_deepseek's if/else); V1 configs have no factor (1.0).
    if k > 1 and cfg.norm_topk_prob:
        topk_w = topk_w / (topk_w.sum(dim=-1, keepdim=True) + 1e-20)
        if cfg.topk_method == "noaux_tc":
            topk_w = topk_w * cfg.routed_scaling_factor
    else:
        topk_w = topk_w * cfg.routed_scaling_factor
    if loads is not None:
        loads[bias_name(p)] = torch.bincount(topk_idx.reshape(-1), minlength=E)
    y = torch.zeros_like(xf)
    for e in range(E):
        tok, slot = (topk_idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        out = swiglu_mlp(xf[tok], P, p + f"experts.{e}.")
        y = y.index_add(0, tok, (out * topk_w[tok, slot].unsqueeze(-1)).to(y.dtype))  # autocast: bf16 out
    if cfg.n_shared_experts > 0:
        y = y + swiglu_mlp(xf, P, p + "shared_experts.")

    aux = torch.zeros((), dtype=x.dtype)
    if cfg.topk_method == "noaux_tc":
        # DeepSeek-V3's sequence-wise balance loss averages the normalised scores s / sum(s).
        scores = scores / scores.sum(dim=-1, keepdim=True)
    if cfg.aux_loss_alpha > 0:
        with torch.no_grad():  # ce comes from indices: no gradient
            if cfg.seq_aux:
                ce = torch.zeros(B, E, dtype=x.dtype)
                ce.scatter_add_(1, topk_idx.view(B, T * k), torch.ones(B, T * k, dtype=x.dtype))
                ce /= T * k / E
            else:
                ce = F.one_hot(topk_idx.view(-1), num_classes=E).to(x.dtype).mean(0)
        if cfg.seq_aux:
            aux = (ce * scores.view(B, T, E).mean(dim=1)).sum(dim=1).mean() * cfg.aux_loss_alpha
        else:
            fi = ce * E
            Pi = scores.mean(0)
            aux = (Pi * fi).sum() * cfg.aux_loss_alpha
    return y.view(B, T, H), aux


def forward(P, cfg, tokens, biases=None, loads=None):
    """tokens [B, T+1] int -> (logits [B,T,V], total loss, ce loss, aux loss, routing margins).
    biases: the noaux_tc selection biases by name; loads (a dict) collects each layer's loads."""
    inputs, targets = tokens[:, :-1].long(), tokens[:, 1:].long()
    eps = cfg.rms_norm_eps
    x = F.embedding(inputs, P["model.embed_tokens.weight"])
    aux_total = torch.zeros((), dtype=x.dtype)
    diag = {"margins": [], "rerouted": []}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        attn = mla_attention if cfg.mla else attention
        h = x + attn(rmsnorm(x, P[p + "input_layernorm.weight"], eps), P, p + "self_attn.", cfg)
        hn = rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        if cfg.is_moe_layer(i):
            m, aux = moe(hn, P, p + "mlp.", cfg, diag, biases, loads)
            aux_total = aux_total + aux
        else:
            m = swiglu_mlp(hn, P, p + "mlp.")
        x = h + m
    x = rmsnorm(x, P["model.norm.weight"], eps)
    logits = linear(x, P["lm_head.weight"])
    ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    total = ce + aux_total
    if cfg.mtp_depth:
        mtp, mtp_aux = mtp_forward(P, cfg, tokens, x, diag, biases)
        aux_total = aux_total + mtp_aux
        total = total + mtp_aux + cfg.mtp_weight * mtp
        diag["mtp"] = mtp
    return logits, total, ce, aux_total, diag


def mtp_forward(P, cfg, tokens, h, diag, biases):
    """DeepSeek-V3's multi-token prediction module of depth 1 (the V3 report, section 2.2; tensor
    names and the [embedding | state] order as DeepSeek-V3's checkpoint and vLLM's deepseek_mtp):
    position t reads the final-normed state h_t and the embedding of token t+1 and predicts token
    t+2; embedding and output head are the main model's. Returns (mean ce over the B*(T-1)
    positions that have a token t+2, the block's balance loss)."""
    eps, L = cfg.rms_norm_eps, cfg.num_layers
    p = f"model.layers.{L}."
    e = F.embedding(tokens[:, 1:].long(), P["model.embed_tokens.weight"])  # token t+1 [B, T, H]
    x = linear(torch.cat([rmsnorm(e, P[p + "enorm.weight"], eps), rmsnorm(h, P[p + "hnorm.weight"], eps)],
                         dim=-1), P[p + "eh_proj.weight"])
    attn = mla_attention if cfg.mla else attention
    hh = x + attn(rmsnorm(x, P[p + "input_layernorm.weight"], eps), P, p + "self_attn.", cfg)
    hn = rmsnorm(hh, P[p + "post_attention_layernorm.weight"], eps)
    aux = torch.zeros((), dtype=x.dtype)
    if cfg.is_moe_layer(L):
        # Its selection bias is held at zero (moetrain does not update it).
        b = dict(biases or {})
        if cfg.topk_method == "noaux_tc":
            b[bias_name(p + "mlp.")] = torch.zeros(int(cfg.n_routed_experts))
        m, aux = moe(hn, P, p + "mlp.", cfg, diag, b, None)
    else:
        m = swiglu_mlp(hn, P, p + "mlp.")
    x = rmsnorm(hh + m, P[p + "shared_head.norm.weight"], eps)
    logits = linear(x, P["lm_head.weight"])  # [B, T, V]; position T-1 has no token t+2
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), tokens[:, 2:].long().reshape(-1))
    return ce, aux


def lr_at(step, t):
    """Linear warmup to lr, then cosine decay to min_lr (0-based step)."""
    lr, min_lr, warmup, total = t["lr"], t["min_lr"], int(t["warmup_steps"]), int(t["total_steps"])
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(max((step - warmup) / max(1, total - warmup), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def make_params(weights, names, dtype):
    return {n: weights[n].to(dtype).clone().requires_grad_(True) for n in names}


def update_bias(bias, load, rate):
    """Aux-loss-free balancing after a step: b += rate * sign(mean(load) - load), in float32."""
    sign = torch.sign(load.to(torch.float64).mean() - load.to(torch.float64)).to(torch.float32)
    return bias + torch.tensor(rate, dtype=torch.float32) * sign


def train(weights, names, cfg, t, train_tokens, dtype, biases=None):
    """AdamW steps on train_tokens[s]; returns the loss of each step, before its update, the
    parameters after the last update and (noaux_tc) the selection biases after the last update."""
    biases = {n: b.clone() for n, b in (biases or {}).items()}
    P = make_params(weights, names, dtype)
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(t["weight_decay"])},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=float(t["lr"]), betas=(float(t["beta1"]), float(t["beta2"])), eps=float(t["eps"]))
    losses = []
    for s in range(train_tokens.shape[0]):
        opt.zero_grad(set_to_none=True)
        loads = {}
        _, loss, _, _, _ = forward(P, cfg, train_tokens[s], biases, loads)
        loss.backward()
        # An expert that got no token has no autograd gradient; it is a zero gradient (AdamW still
        # decays its weights and moments and counts the step, as a dense optimizer does).
        for p in P.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if float(t.get("grad_clip", 0.0)) > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), float(t["grad_clip"]))
        for g in opt.param_groups:
            g["lr"] = lr_at(s, t)
        opt.step()
        losses.append(float(loss))
        for n in biases:
            biases[n] = update_bias(biases[n], loads[n], float(cfg.bias_update_speed))
    return losses, P, biases


# ------------------------------------------------------------------------------------------------
# Comparison

class Report:
    def __init__(self, tol):
        self.tol = tol
        self.rows = []  # (error, name, shape, max_ref, ok, tol, note)

    def compare(self, name, cpp, ref, tol=None):
        tol = self.tol if tol is None else tol
        ref = ref.detach().to(torch.float64)
        if cpp is None:
            self.fail(name, "missing in expected.safetensors")
            return
        cpp = cpp.to(torch.float64)
        if list(cpp.shape) != list(ref.shape):
            self.fail(name, f"shape {list(cpp.shape)} != expected {list(ref.shape)}")
            return
        scale = max(float(ref.abs().max()) if ref.numel() else 0.0, 1e-12)
        diff = float((cpp - ref).abs().max()) if ref.numel() else 0.0
        err = diff / scale
        ok = err <= tol  # NaN compares False: a NaN fails
        self.rows.append((err, name, list(ref.shape), scale, ok, tol, ""))

    def fail(self, name, note):
        self.rows.append((float("inf"), name, [], 0.0, False, self.tol, note))

    def print_table(self, out=sys.stdout):
        def key(r):  # NaN first, then worst error first
            return (0, 0.0, r[1]) if r[0] != r[0] else (1, -r[0], r[1])
        rows = sorted(self.rows, key=key)
        w = max([len(r[1]) for r in rows] + [4])
        print(f"{'name':<{w}}  {'shape':<16} {'max|torch|':>11} {'error':>10} {'bound':>8}  status",
              file=out)
        for err, name, shape, scale, ok, tol, note in rows:
            shape_s = "x".join(map(str, shape)) if shape else "-"
            err_s = f"{err:10.3e}"
            status = "ok" if ok else "FAIL"
            print(f"{name:<{w}}  {shape_s:<16} {scale:11.4e} {err_s} {tol:8.0e}  {status}"
                  + (f"  ({note})" if note else ""), file=out)

    def counts(self):
        passed = sum(1 for r in self.rows if r[4])
        return passed, len(self.rows) - passed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("dump_dir")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--weight-tol", type=float, default=None,
                    help=f"bound on the error of each weight after the training steps (default {WEIGHT_TOL:g}, "
                    f"{BF16_WEIGHT_TOL:g} with bf16 GEMM inputs)")
    ap.add_argument("--grad-tol", type=float, default=None,
                    help=f"bound on the error of each gradient (default --tol, {BF16_GRAD_TOL:g} with bf16 GEMM "
                    "inputs)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="precision of the torch side (float64 to see the C++ round-off alone)")
    args = ap.parse_args(argv)
    D = args.dump_dir
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    global GEMM_BF16
    torch.use_deterministic_algorithms(True)

    try:
        with open(os.path.join(D, "config.json")) as f:
            cfg = Config(json.load(f))
        with open(os.path.join(D, "train.json")) as f:
            tcfg = json.load(f)
        GEMM_BF16 = tcfg.get("gemm_precision", "fp32") == "bf16"
        cfg.mtp_weight = float(tcfg.get("mtp_weight", 0.0))
        weights, _ = load_safetensors(os.path.join(D, "model.safetensors"))
        batch, _ = load_safetensors(os.path.join(D, "batch.safetensors"))
        expected, _ = load_safetensors(os.path.join(D, "expected.safetensors"))
        tokens = batch["tokens"]
        bias_file = None
        if cfg.topk_method == "noaux_tc":
            bias_file, _ = load_safetensors(os.path.join(D, "bias.safetensors"))
    except (OSError, ValueError, KeyError) as e:  # JSONDecodeError is a ValueError
        print(f"cannot read the dump in {D}: {type(e).__name__}: {e}")
        print("torch reference: 0 checks passed, 1 failed")
        return 1

    if args.weight_tol is None:
        args.weight_tol = BF16_WEIGHT_TOL if GEMM_BF16 else WEIGHT_TOL
    if args.grad_tol is None:
        args.grad_tol = BF16_GRAD_TOL if GEMM_BF16 else args.tol
    rep = Report(args.tol)
    shapes = cfg.param_shapes()
    names = list(shapes)

    # Parameter names: the file and the model must agree both ways, with the same shapes.
    for n in names:
        if n not in weights:
            rep.fail(n, "parameter missing from model.safetensors")
        elif list(weights[n].shape) != shapes[n]:
            rep.fail(n, f"model.safetensors shape {list(weights[n].shape)} != config's {shapes[n]}")
        elif weights[n].dtype != torch.float32:
            rep.fail(n, f"model.safetensors dtype {weights[n].dtype}, expected F32")
    for n in weights:
        if n not in shapes:
            rep.fail(n, "model.safetensors holds a tensor the model does not have")
    grad_names = {n[len("grad."):] for n in expected if n.startswith("grad.")}
    for n in sorted(grad_names - set(shapes)):
        rep.fail("grad." + n, "expected.safetensors holds a gradient of no parameter")
    if any(not r[4] for r in rep.rows):
        rep.print_table()
        print(f"torch reference: {rep.counts()[0]} checks passed, {rep.counts()[1]} failed "
              "(parameter names or shapes do not match the config)")
        return 1

    B, T1 = tokens.shape
    if int(tcfg.get("batch", B)) != B or int(tcfg.get("seq_len", T1 - 1)) != T1 - 1:
        rep.fail("tokens", f"batch.safetensors tokens {list(tokens.shape)} disagree with train.json "
                 f"batch {tcfg.get('batch')} seq_len {tcfg.get('seq_len')}")

    # noaux_tc: the selection biases the C++ side started from, one per MoE layer.
    biases = {}
    if bias_file is not None:
        for i in range(cfg.num_layers):
            if cfg.is_moe_layer(i):
                n = bias_name(f"model.layers.{i}.mlp.")
                b = bias_file.get("init." + n)
                if b is None or list(b.shape) != [int(cfg.n_routed_experts)]:
                    rep.fail("init." + n, "missing or of the wrong shape in bias.safetensors")
                else:
                    biases[n] = b.to(torch.float32)
        if any(not r[4] for r in rep.rows):
            rep.print_table()
            print(f"torch reference: {rep.counts()[0]} checks passed, {rep.counts()[1]} failed")
            return 1

    # One forward/backward on "tokens".
    P = make_params(weights, names, dtype)
    logits, loss, ce, aux, diag = forward(P, cfg, tokens, biases)
    for name, moved, total in diag["rerouted"]:
        if moved == 0:
            rep.fail(name, f"the group limit changed no token's experts (of {total}): "
                     "the group-limited path went untested")
    grads = torch.autograd.grad(loss, [P[n] for n in names], allow_unused=True)
    rep.compare("logits", expected.get("logits"), logits)
    rep.compare("loss", expected.get("loss"), loss.reshape(1))
    rep.compare("ce_loss", expected.get("ce_loss"), ce.reshape(1))
    rep.compare("aux_loss", expected.get("aux_loss"), aux.reshape(1))
    if getattr(cfg, "mtp_depth", 0):  # (hf_moe_ref's families have no MTP module)
        rep.compare("mtp_loss", expected.get("mtp_loss"), diag["mtp"].reshape(1))
    for n, g in zip(names, grads):
        rep.compare("grad." + n, expected.get("grad." + n), torch.zeros_like(P[n]) if g is None else g,
                    tol=args.grad_tol)

    # Training steps from the same initial weights.
    train_tokens = batch.get("train_tokens")
    steps = int(tcfg.get("steps", 10))
    if train_tokens is None or train_tokens.shape[0] != steps:
        rep.fail("train_tokens", f"batch.safetensors train_tokens "
                 f"{None if train_tokens is None else list(train_tokens.shape)}, "
                 f"expected [{steps}, B, T+1]")
        ref_losses = None
    else:
        ref_losses, ref_final, ref_biases = train(weights, names, cfg, tcfg, train_tokens, dtype, biases)
        # The selection biases after the steps: sums of +-gamma, exact in fp32 unless a load
        # count differs (then by 2 gamma at least).
        for n, b in ref_biases.items():
            rep.compare("final." + n, bias_file.get("final." + n), b, tol=1e-6)
        cpp_losses = expected.get("train_losses")
        if cpp_losses is None or cpp_losses.numel() != steps:
            rep.fail("train_losses", "missing or wrong length in expected.safetensors")
        else:
            for s in range(steps):
                rep.compare(f"train_loss[{s}]", cpp_losses[s:s + 1], torch.tensor([ref_losses[s]]))
        # The weights after the last step, every tensor, both ways.
        try:
            final, _ = load_safetensors(os.path.join(D, "final.safetensors"))
        except (OSError, ValueError, KeyError) as e:
            rep.fail("final.safetensors", f"cannot read: {type(e).__name__}: {e}")
            final = None
        if final is not None:
            for n in names:
                rep.compare("final." + n, final.get(n), ref_final[n], tol=args.weight_tol)
            for n in sorted(set(final) - set(names)):
                rep.fail("final." + n, "final.safetensors holds a tensor the model does not have")

    print(f"torch reference ({args.dtype}{', bf16 GEMM inputs' if GEMM_BF16 else ''}) in {D}: {cfg.num_layers} layers, H={cfg.hidden_size}, "
          f"heads={cfg.num_heads}, E={cfg.n_routed_experts}, k={cfg.top_k}, "
          f"F={cfg.moe_intermediate_size}, shared={cfg.n_shared_experts}, V={cfg.vocab_size}, "
          f"B={B}, T={T1 - 1}")
    print(f"error = max|cpp - torch| / max(max|torch|, 1e-12), per tensor; pass if <= {args.tol:g} "
          f"({args.grad_tol:g} for the gradients, {args.weight_tol:g} for the final weights)")
    rep.print_table()
    print(f"loss: torch {float(loss):.7f} cpp "
          f"{float(expected['loss'][0]) if 'loss' in expected else float('nan'):.7f}")
    if ref_losses is not None:
        print("train losses (torch): " + " ".join(f"{v:.5f}" for v in ref_losses))
    for name, m in diag["margins"]:
        warn = "  <- near-tie: routing may legitimately differ" if m < 1e-5 else ""
        print(f"routing margin (k-th minus (k+1)-th score, min over tokens) {name}: {m:.3e}{warn}")
    for name, moved, total in diag["rerouted"]:
        print(f"group limit {name}: {moved} of {total} tokens routed to other experts than plain top-k")
    passed, failed = rep.counts()
    print(f"torch reference: {passed} checks passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
