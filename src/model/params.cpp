#include "model/params.h"

#include <limits>

#include "core/checked_math.h"
#include "core/error.h"
#include "io/safetensors.h"  // shape_str
#include "model/family.h"

namespace moe::model {

void ParamLayout::add(std::string name, std::vector<int64_t> shape, bool decay, bool is_expert,
                      int tp_dim) {
  std::vector<int64_t> full_shape = shape;
  if (tp_dim >= 0) {
    MOE_CHECK(shape[tp_dim] % tp_.size == 0, "parameter ", name, ": dimension ", tp_dim, " of shape ",
              io::shape_str(shape), " does not split over tensor parallelism ", tp_.size);
    shape[tp_dim] /= tp_.size;
  }
  // Checked (ModelConfig::validate bounds these already; a layout of an unvalidated config must
  // still not wrap to a small block that initialisation then writes past). The bound keeps
  // total * 16 bytes (weights, gradients, AdamW m and v) within size_t.
  constexpr size_t kMaxElems = std::numeric_limits<size_t>::max() / 16;
  ParamSpec s;
  s.numel = 1;
  for (int64_t d : shape) {
    MOE_CHECK(d >= 0 && checked_mul(s.numel, static_cast<size_t>(d), &s.numel) && s.numel <= kMaxElems,
              "parameter ", name, ": shape ", io::shape_str(shape), " is too large");
  }
  size_t new_total = 0;
  MOE_CHECK(checked_add(total_, s.numel, &new_total) && new_total <= kMaxElems,
            "parameter ", name, ": the model's parameter count overflows (", total_, " + ", s.numel, ")");
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.offset = total_;
  s.decay = decay;
  s.is_expert = is_expert;
  s.tp_dim = tp_.size > 1 ? tp_dim : -1;
  s.full_shape = std::move(full_shape);
  total_ = new_total;
  index_[s.name] = specs_.size();
  specs_.push_back(std::move(s));
}

ExpertShard ExpertShard::of(const balance::Placement& placement, int ep_rank) {
  ExpertShard s;
  s.per_layer.resize(placement.layers.size());
  for (size_t l = 0; l < placement.layers.size(); ++l)
    if (!placement.layers[l].empty()) s.per_layer[l] = placement.layers[l].experts_of(ep_rank);
  return s;
}

std::vector<int> ExpertShard::experts(int layer, int num_experts) const {
  if (!per_layer.empty()) {
    MOE_CHECK(layer >= 0 && layer < static_cast<int>(per_layer.size()) &&
                  static_cast<int>(per_layer[layer].size()) == num_local(num_experts),
              "expert shard: layer ", layer, " has no placement of ", num_local(num_experts), " experts");
    return per_layer[layer];
  }
  std::vector<int> out(num_local(num_experts));
  for (size_t i = 0; i < out.size(); ++i) out[i] = begin + static_cast<int>(i);
  return out;
}

int ExpertShard::num_local(int num_experts) const {
  if (!per_layer.empty())
    for (const auto& l : per_layer)
      if (!l.empty()) return static_cast<int>(l.size());
  return count < 0 ? num_experts : count;
}

bool ExpertShard::holds_all(int num_experts) const {
  if (per_layer.empty()) return count < 0 || (begin == 0 && count == num_experts);
  for (const auto& l : per_layer)
    for (size_t i = 0; i < l.size(); ++i)
      if (l.size() != static_cast<size_t>(num_experts) || l[i] != static_cast<int>(i)) return false;
  return true;
}

ParamLayout::ParamLayout(const ModelConfig& c, ExpertShard shard, StageSpec stage, TpShard tp)
    : shard_(std::move(shard)), stage_(stage), tp_(tp) {
  MOE_CHECK(tp_.size >= 1 && tp_.rank >= 0 && tp_.rank < tp_.size, "tensor-parallel rank ", tp_.rank,
            " is outside a group of ", tp_.size);
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t F = c.moe_intermediate_size, E = c.n_routed_experts;
  if (shard_.per_layer.empty() && shard_.count < 0) shard_.count = static_cast<int>(E);
  MOE_CHECK(!shard_.per_layer.empty() || (shard_.begin >= 0 && shard_.begin + shard_.count <= E),
            "expert shard [", shard_.begin, ", ", shard_.begin + shard_.count, ") is outside the ", E,
            " routed experts");
  const int64_t Fs = c.shared_ffn();
  // Attention widths: q and o span heads · head_dim, k and v kv_heads · head_dim (both H for
  // DeepSeek's multi-head attention).
  const int64_t A = int64_t{c.num_attention_heads} * c.head_dim(), Akv = int64_t{c.kv_heads()} * c.head_dim();
  const int l_end = stage_.end_layer(c);
  MOE_CHECK(stage_.first_layer >= 0 && stage_.first_layer <= l_end && l_end <= c.num_hidden_layers,
            "stage layers [", stage_.first_layer, ", ", l_end, ") are outside the model's ",
            c.num_hidden_layers, " layers");
  if (stage_.embedding) add("model.embed_tokens.weight", {V, H}, true);
  // The MTP module (below) reads the embedding: the last stage of a pipeline keeps a tied copy.
  const bool mtp = stage_.head && c.num_nextn_predict_layers > 0;
  if (mtp && !stage_.embedding) {
    add("model.embed_tokens.weight", {V, H}, true);
    specs_.back().tied_copy = true;
  }
  // Layer l's tensors. mtp: the multi-token-prediction block, whose experts every rank holds
  // whole (not expert-parallel: is_expert false, summed over the data group like dense weights).
  auto add_layer = [&](int l, bool mtp) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, false);
    // Heads split over TP: q, k, v by output rows, o_proj by input columns (Megatron's column- and
    // row-parallel linears); the same for the dense MLP's gate/up and down.
    if (c.uses_mla()) {
      // Multi-head latent attention: the latents replicated, the heads split (as q/k/v and o).
      const int64_t nh = c.num_attention_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
      const int64_t dqk = c.qk_head_dim(), dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
      if (rq > 0) {
        add(p + "self_attn.q_a_proj.weight", {rq, H}, true);
        add(p + "self_attn.q_a_layernorm.weight", {rq}, false);
        add(p + "self_attn.q_b_proj.weight", {nh * dqk, rq}, true, false, 0);
      } else {
        add(p + "self_attn.q_proj.weight", {nh * dqk, H}, true, false, 0);
      }
      add(p + "self_attn.kv_a_proj_with_mqa.weight", {rkv + dr, H}, true);
      add(p + "self_attn.kv_a_layernorm.weight", {rkv}, false);
      add(p + "self_attn.kv_b_proj.weight", {nh * (dn + dv), rkv}, true, false, 0);
      add(p + "self_attn.o_proj.weight", {H, nh * dv}, true, false, 1);
    } else {
      for (const char* m : {"q_proj", "k_proj", "v_proj"})
        add(p + "self_attn." + m + ".weight", {m[0] == 'q' ? A : Akv, H}, true, false, 0);
      add(p + "self_attn.o_proj.weight", {H, A}, true, false, 1);
      if (c.qkv_bias())  // qwen2_moe; split with their rows, no weight decay, initialised to 0
        for (const char* m : {"q_proj", "k_proj", "v_proj"})
          add(p + "self_attn." + m + ".bias", {m[0] == 'q' ? A : Akv}, false, false, 0);
      if (c.qk_norm()) {  // qwen3_moe: one [head_dim] RMSNorm weight shared by every q (k) head
        add(p + "self_attn.q_norm.weight", {c.head_dim()}, false);
        add(p + "self_attn.k_norm.weight", {c.head_dim()}, false);
      }
    }
    add(p + "post_attention_layernorm.weight", {H}, false);
    if (!c.is_moe_layer(l)) {
      add(p + "mlp.gate_proj.weight", {I, H}, true, false, 0);
      add(p + "mlp.up_proj.weight", {I, H}, true, false, 0);
      add(p + "mlp.down_proj.weight", {H, I}, true, false, 1);
      return;
    }
    // The MoE block's names are the family's (model/family.h).
    add(router_name(c, l), {E, H}, true);
    // Stacked by projection, so each projection of all experts is one [E, ...] array.
    std::vector<int> held;
    if (mtp) {
      for (int e = 0; e < E; ++e) held.push_back(e);
    } else {
      held = shard_.experts(l, static_cast<int>(E));
    }
    for (Proj m : {Proj::kGate, Proj::kUp, Proj::kDown}) {
      const bool down = m == Proj::kDown;
      for (int e : held)
        add(expert_name(c, l, e, m), down ? std::vector<int64_t>{H, F} : std::vector<int64_t>{F, H}, true, !mtp);
    }
    if (Fs > 0) {
      add(shared_name(c, l, Proj::kGate), {Fs, H}, true);
      add(shared_name(c, l, Proj::kUp), {Fs, H}, true);
      add(shared_name(c, l, Proj::kDown), {H, Fs}, true);
      if (c.gated_shared_expert()) add(shared_gate_name(c, l), {1, H}, true);
    }
  };
  for (int l = stage_.first_layer; l < l_end; ++l) add_layer(l, false);
  if (mtp) {
    // The multi-token-prediction module (MtpTensors), named as DeepSeek-V3's layer L.
    const int L = c.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(L) + ".";
    add(p + "enorm.weight", {H}, false);
    add(p + "hnorm.weight", {H}, false);
    add(p + "eh_proj.weight", {H, 2 * H}, true);
    add_layer(L, true);
    add(p + "shared_head.norm.weight", {H}, false);
  }
  if (stage_.head) {
    add("model.norm.weight", {H}, false);
    add("lm_head.weight", {V, H}, true);
  }
}

const ParamSpec& ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "unknown parameter \"", name, "\"");
  return specs_[it->second];
}

ModelTensors bind_tensors(const ParamLayout& layout, const ModelConfig& c, float* base) {
  auto at = [&](const std::string& name) { return base + layout.find(name).offset; };
  ModelTensors t;
  const StageSpec& st = layout.stage();
  if (layout.contains("model.embed_tokens.weight")) t.embed = at("model.embed_tokens.weight");
  if (st.head) {
    t.norm = at("model.norm.weight");
    t.lm_head = at("lm_head.weight");
  }
  t.layers.resize(c.num_hidden_layers + c.num_nextn_predict_layers);
  const bool mtp = st.head && c.num_nextn_predict_layers > 0;
  if (mtp) {
    const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    t.mtp.enorm = at(p + "enorm.weight");
    t.mtp.hnorm = at(p + "hnorm.weight");
    t.mtp.eh_proj = at(p + "eh_proj.weight");
    t.mtp.norm = at(p + "shared_head.norm.weight");
  }
  std::vector<int> bound;
  for (int l = st.first_layer; l < st.end_layer(c); ++l) bound.push_back(l);
  if (mtp) bound.push_back(c.num_hidden_layers);
  for (int l : bound) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    LayerTensors& L = t.layers[l];
    L.input_norm = at(p + "input_layernorm.weight");
    if (c.uses_mla()) {
      if (c.q_lora_rank > 0) {
        L.q_a = at(p + "self_attn.q_a_proj.weight");
        L.q_a_norm = at(p + "self_attn.q_a_layernorm.weight");
        L.q_b = at(p + "self_attn.q_b_proj.weight");
      } else {
        L.q = at(p + "self_attn.q_proj.weight");
      }
      L.kv_a = at(p + "self_attn.kv_a_proj_with_mqa.weight");
      L.kv_a_norm = at(p + "self_attn.kv_a_layernorm.weight");
      L.kv_b = at(p + "self_attn.kv_b_proj.weight");
    } else {
      L.q = at(p + "self_attn.q_proj.weight");
      L.k = at(p + "self_attn.k_proj.weight");
      L.v = at(p + "self_attn.v_proj.weight");
    }
    L.o = at(p + "self_attn.o_proj.weight");
    L.post_norm = at(p + "post_attention_layernorm.weight");
    if (c.qkv_bias()) {
      L.q_bias = at(p + "self_attn.q_proj.bias");
      L.k_bias = at(p + "self_attn.k_proj.bias");
      L.v_bias = at(p + "self_attn.v_proj.bias");
    }
    if (c.qk_norm()) {
      L.q_norm = at(p + "self_attn.q_norm.weight");
      L.k_norm = at(p + "self_attn.k_norm.weight");
    }
    if (!c.is_moe_layer(l)) {
      L.mlp_gate = at(p + "mlp.gate_proj.weight");
      L.mlp_up = at(p + "mlp.up_proj.weight");
      L.mlp_down = at(p + "mlp.down_proj.weight");
      continue;
    }
    L.router = at(router_name(c, l));
    // The MTP block holds every expert in order; the others the shard's.
    const std::vector<int> held = l == c.num_hidden_layers ? std::vector<int>{0}
                                                           : layout.shard().experts(l, c.n_routed_experts);
    if (!held.empty()) {  // the stacked arrays start at the first slot's expert
      L.experts_gate = at(expert_name(c, l, held[0], Proj::kGate));
      L.experts_up = at(expert_name(c, l, held[0], Proj::kUp));
      L.experts_down = at(expert_name(c, l, held[0], Proj::kDown));
    }
    if (c.shared_ffn() > 0) {
      L.shared_gate = at(shared_name(c, l, Proj::kGate));
      L.shared_up = at(shared_name(c, l, Proj::kUp));
      L.shared_down = at(shared_name(c, l, Proj::kDown));
      if (c.gated_shared_expert()) L.shared_expert_gate = at(shared_gate_name(c, l));
    }
  }
  return t;
}

}  // namespace moe::model
