#!/usr/bin/env python3
"""Independent PyTorch reference for moetrain's other families: Mixtral, Qwen2-MoE, Qwen3-MoE.

Usage: hf_moe_ref.py DUMP_DIR [deepseek_ref.py's options]

The dump (tool_ref_dump), the comparison, the error bounds and the AdamW training loop are
deepseek_ref.py's; this file supplies the model, written after Hugging Face transformers'
modeling_mixtral.py, modeling_qwen2_moe.py and modeling_qwen3_moe.py:
  attention   q/k/v projections (Qwen2-MoE: with biases), Qwen3-MoE: RMSNorm over head_dim on each
              q and k head (q_norm / k_norm) before RoPE; RoPE over head_dim; grouped-query
              attention by repeat_kv (query head h reads key/value head h // n_rep); o_proj
  router      softmax over all experts (float), top-k, the k weights renormalised (Mixtral always,
              Qwen when norm_topk_prob)
  experts     SwiGLU: Mixtral w2(silu(w1 x) * w3 x), Qwen down_proj(silu(gate_proj x) * up_proj x)
  shared      Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
  layers      Mixtral: every layer sparse; Qwen: (i + 1) % decoder_sparse_step == 0 and i not in
              mlp_only_layers, the others a dense MLP of intermediate_size
  aux loss    HF's load_balancing_loss_func, times router_aux_loss_coef, only when
              output_router_logits. HF pools the router logits of ALL layers into one call;
              moetrain (model/family.h) takes the mean over MoE layers of the call on each layer
              alone. The model below is moetrain's form (so the C++ aux loss, the loss and every
              router gradient are checked against it); HF's pooled value is printed beside it.
              self_check() shows HF's function on one layer is the DeepSeek-form loss that the
              C++ router computes, with alpha = coef * k.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as ds  # noqa: E402

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")


class Config:
    def __init__(self, d):
        self.raw = d
        self.model_type = d.get("model_type")
        if self.model_type not in FAMILIES:
            raise ValueError(f"config.json: model_type {self.model_type!r} is not one of {FAMILIES}")
        mixtral = self.model_type == "mixtral"
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.num_layers = int(d["num_hidden_layers"])
        self.num_heads = int(d["num_attention_heads"])
        self.num_kv_heads = int(d["num_key_value_heads"])
        # getattr(config, "head_dim", None) or hidden_size // num_attention_heads, as HF does
        self.head_dim = int(d.get("head_dim") or self.hidden_size // self.num_heads)
        self.intermediate_size = int(d["intermediate_size"])
        self.top_k = int(d["num_experts_per_tok"])
        if mixtral:
            self.n_routed_experts = int(d["num_local_experts"])
            self.moe_intermediate_size = self.intermediate_size
            self.norm_topk_prob = True  # MixtralSparseMoeBlock always renormalises
        else:
            self.n_routed_experts = int(d["num_experts"])
            self.moe_intermediate_size = int(d["moe_intermediate_size"])
            self.norm_topk_prob = bool(d.get("norm_topk_prob", False))
        self.shared_expert_intermediate_size = int(d.get("shared_expert_intermediate_size") or 0) \
            if self.model_type == "qwen2_moe" else 0
        self.n_shared_experts = 1 if self.shared_expert_intermediate_size > 0 else 0
        self.decoder_sparse_step = int(d.get("decoder_sparse_step") or 1)
        self.mlp_only_layers = list(d.get("mlp_only_layers") or [])
        self.qkv_bias = self.model_type == "qwen2_moe"
        self.qk_norm = self.model_type == "qwen3_moe"
        self.aux_coef = float(d.get("router_aux_loss_coef", 0.001)) if d.get("output_router_logits") else 0.0
        self.rope_theta = float(d.get("rope_theta", 1e6 if mixtral else 1e4))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-5 if mixtral else 1e-6))
        # deepseek_ref's main and training loop read these
        self.topk_method = "greedy"
        self.bias_update_speed = 0.0
        problems = []
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_attention_heads {self.num_heads} is not a multiple of "
                            f"num_key_value_heads {self.num_kv_heads}")
        if d.get("tie_word_embeddings"):
            problems.append("tie_word_embeddings = true is not supported")
        if d.get("rope_scaling"):
            problems.append("rope_scaling is not supported")
        if d.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act {d.get('hidden_act')!r} is not supported")
        if d.get("attention_bias") and self.model_type != "qwen2_moe":
            problems.append("attention_bias is not supported")
        window = d.get("sliding_window") if (mixtral or d.get("use_sliding_window")) else None
        if window:
            self.window = int(window)
        else:
            self.window = None
        if problems:
            raise ValueError("config.json: " + "; ".join(problems))

    def is_moe_layer(self, i):
        if self.n_routed_experts <= 0:
            return False
        if self.model_type == "mixtral":
            return True
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def moe_prefix(self, i):
        return f"model.layers.{i}." + ("block_sparse_moe." if self.model_type == "mixtral" else "mlp.")

    def proj_names(self):
        """gate, up, down of an expert"""
        if self.model_type == "mixtral":
            return "w1", "w3", "w2"
        return "gate_proj", "up_proj", "down_proj"

    def param_shapes(self):
        """{name: shape} of every parameter, in model order."""
        V, H, I = self.vocab_size, self.hidden_size, self.intermediate_size
        A, Akv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {"model.embed_tokens.weight": [V, H]}
        g, u, dn = self.proj_names()
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = [H]
            shapes[p + "self_attn.q_proj.weight"] = [A, H]
            shapes[p + "self_attn.k_proj.weight"] = [Akv, H]
            shapes[p + "self_attn.v_proj.weight"] = [Akv, H]
            shapes[p + "self_attn.o_proj.weight"] = [H, A]
            if self.qkv_bias:
                shapes[p + "self_attn.q_proj.bias"] = [A]
                shapes[p + "self_attn.k_proj.bias"] = [Akv]
                shapes[p + "self_attn.v_proj.bias"] = [Akv]
            if self.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = [self.head_dim]
                shapes[p + "self_attn.k_norm.weight"] = [self.head_dim]
            shapes[p + "post_attention_layernorm.weight"] = [H]
            if self.is_moe_layer(i):
                E, Fm = self.n_routed_experts, self.moe_intermediate_size
                m = self.moe_prefix(i)
                shapes[m + "gate.weight"] = [E, H]
                for e in range(E):
                    q = m + f"experts.{e}."
                    shapes[q + g + ".weight"] = [Fm, H]
                    shapes[q + u + ".weight"] = [Fm, H]
                    shapes[q + dn + ".weight"] = [H, Fm]
                if self.n_shared_experts:
                    Fs = self.shared_expert_intermediate_size
                    shapes[m + "shared_expert.gate_proj.weight"] = [Fs, H]
                    shapes[m + "shared_expert.up_proj.weight"] = [Fs, H]
                    shapes[m + "shared_expert.down_proj.weight"] = [H, Fs]
                    shapes[m + "shared_expert_gate.weight"] = [1, H]
            else:
                shapes[p + "mlp.gate_proj.weight"] = [I, H]
                shapes[p + "mlp.up_proj.weight"] = [I, H]
                shapes[p + "mlp.down_proj.weight"] = [H, I]
        shapes["model.norm.weight"] = [H]
        shapes["lm_head.weight"] = [V, H]
        return shapes


def repeat_kv(x, n_rep):
    """HF repeat_kv: [B, nkv, T, d] -> [B, nkv * n_rep, T, d], head h reading kv head h // n_rep."""
    B, nkv, T, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, nkv, n_rep, T, d).reshape(B, nkv * n_rep, T, d)


def attention(x, P, p, cfg):
    B, T, H = x.shape
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    eps = cfg.rms_norm_eps

    def proj(name, heads):
        y = ds.linear(x, P[p + name + ".weight"])
        if cfg.qkv_bias:
            y = y + P[p + name + ".bias"]
        return y.view(B, T, heads, d)

    q, k, v = proj("q_proj", nh), proj("k_proj", nkv), proj("v_proj", nkv)
    if cfg.qk_norm:  # Qwen3MoeAttention: q_norm / k_norm on each head, before RoPE
        q = ds.rmsnorm(q, P[p + "q_norm.weight"], eps)
        k = ds.rmsnorm(k, P[p + "k_norm.weight"], eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = ds.rope_cos_sin(T, d, cfg.rope_theta, x.dtype)
    q = q * cos + ds.rotate_half(q) * sin
    k = k * cos + ds.rotate_half(k) * sin
    k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
    att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
    out = torch.matmul(att, v).transpose(1, 2).reshape(B, T, nh * d)
    return ds.linear(out, P[p + "o_proj.weight"])


def expert_mlp(x, P, q, cfg):
    g, u, dn = cfg.proj_names()
    return ds.linear(F.silu(ds.linear(x, P[q + g + ".weight"])) * ds.linear(x, P[q + u + ".weight"]),
                     P[q + dn + ".weight"])


def load_balancing_loss_func(gate_logits, num_experts, top_k):
    """transformers' load_balancing_loss_func without an attention mask: the router logits of the
    given layers concatenated, softmax, top-k, then E * sum(tokens_per_expert * router_prob)."""
    concatenated = torch.cat(list(gate_logits), dim=0)
    routing_weights = F.softmax(concatenated, dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_experts)
    tokens_per_expert = torch.mean(expert_mask.to(routing_weights.dtype), dim=0)  # [k, E]
    router_prob_per_expert = torch.mean(routing_weights, dim=0)  # [E]
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


def moe(x, P, m, cfg, diag):
    """The sparse block (MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock).
    Returns (y [B,T,H], router logits [N,E])."""
    B, T, H = x.shape
    E, k = cfg.n_routed_experts, cfg.top_k
    xf = x.reshape(B * T, H)
    router_logits = ds.linear(xf, P[m + "gate.weight"])
    routing_weights = F.softmax(router_logits, dim=1, dtype=x.dtype)
    routing_weights, selected = torch.topk(routing_weights, k, dim=-1)
    if k < E:  # a near-tie of the k-th choice can flip routing
        top = torch.topk(router_logits.detach().softmax(dim=1), k + 1, dim=-1).values
        diag["margins"].append((m + "gate", float((top[:, k - 1] - top[:, k]).min())))
    if cfg.norm_topk_prob:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    y = torch.zeros_like(xf)
    for e in range(E):
        tok, slot = (selected == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        out = expert_mlp(xf[tok], P, m + f"experts.{e}.", cfg) * routing_weights[tok, slot, None]
        y = y.index_add(0, tok, out.to(y.dtype))
    if cfg.n_shared_experts:
        shared = ds.swiglu_mlp(xf, P, m + "shared_expert.")
        y = y + torch.sigmoid(ds.linear(xf, P[m + "shared_expert_gate.weight"])) * shared
    return y.view(B, T, H), router_logits


def forward(P, cfg, tokens, biases=None, loads=None):
    """tokens [B, T+1] -> (logits, total loss, ce loss, aux loss, diag), deepseek_ref's contract."""
    inputs, targets = tokens[:, :-1].long(), tokens[:, 1:].long()
    T = inputs.shape[1]
    if cfg.window is not None and T > cfg.window:
        raise ValueError(f"sequence length {T} exceeds sliding_window {cfg.window}")
    eps = cfg.rms_norm_eps
    x = F.embedding(inputs, P["model.embed_tokens.weight"])
    diag = {"margins": [], "rerouted": [], "router_logits": []}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = x + attention(ds.rmsnorm(x, P[p + "input_layernorm.weight"], eps), P, p + "self_attn.", cfg)
        hn = ds.rmsnorm(h, P[p + "post_attention_layernorm.weight"], eps)
        if cfg.is_moe_layer(i):
            m, logits = moe(hn, P, cfg.moe_prefix(i), cfg, diag)
            diag["router_logits"].append(logits)
        else:
            m = ds.swiglu_mlp(hn, P, p + "mlp.")
        x = h + m
    x = ds.rmsnorm(x, P["model.norm.weight"], eps)
    logits = ds.linear(x, P["lm_head.weight"])
    ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    aux = torch.zeros((), dtype=x.dtype)
    per_layer = diag["router_logits"]
    if cfg.aux_coef > 0 and per_layer:
        # moetrain's form: the mean over MoE layers of HF's loss on each layer alone.
        terms = [load_balancing_loss_func((lg,), cfg.n_routed_experts, cfg.top_k) for lg in per_layer]
        aux = cfg.aux_coef * torch.stack(terms).mean()
        with torch.no_grad():
            diag["hf_pooled_aux"] = float(cfg.aux_coef * load_balancing_loss_func(
                tuple(per_layer), cfg.n_routed_experts, cfg.top_k))
            diag["per_layer_aux"] = [float(cfg.aux_coef * t) for t in terms]
    return logits, ce + aux, ce, aux, diag


def main(argv=None):
    # deepseek_ref's dump reader, comparison and training loop, with this model.
    first = {}

    def forward_kept(*args, **kwargs):
        out = forward(*args, **kwargs)
        first.setdefault("diag", out[4])
        return out

    ds.Config = Config
    ds.forward = forward_kept
    rc = ds.main(argv)
    diag = first.get("diag", {})
    if "hf_pooled_aux" in diag:
        terms = diag["per_layer_aux"]
        print("aux loss of the checked batch: moetrain (mean over MoE layers of HF's per-layer loss) "
              f"{sum(terms) / len(terms):.7f}; HF (pooled over all layers) {diag['hf_pooled_aux']:.7f}; "
              "per layer " + " ".join(f"{t:.7f}" for t in terms) + " (docs/families.md)")
    return rc


def self_check():
    """load_balancing_loss_func on one layer equals the DeepSeek-form per-layer aux loss that the
    C++ router computes with alpha = coef * k (model/family.h): coef * E * sum_e f_e P_e with f_e the
    fraction of pairs choosing e, checked here on random logits."""
    torch.manual_seed(0)
    N, E, k = 64, 8, 2
    logits = torch.randn(N, E, dtype=torch.float64)
    s = logits.softmax(-1)
    idx = torch.topk(s, k, dim=-1).indices
    count = torch.bincount(idx.reshape(-1), minlength=E).to(torch.float64)
    deepseek_form = k * (count * E / (N * k) * s.mean(0)).sum()  # alpha = coef * k
    hf = load_balancing_loss_func((logits,), E, k)
    assert abs(float(hf - deepseek_form)) < 1e-12, (float(hf), float(deepseek_form))


if __name__ == "__main__":
    self_check()
    sys.exit(main())
