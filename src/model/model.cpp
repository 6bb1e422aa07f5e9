#include "model/model.h"

#include <cmath>
#include <cstring>

#include "comm/group.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu_mlp.h"
#include "model/family.h"
#include "model/mla_block.h"

namespace moe::model {

namespace k = moe::kernels;
namespace mx = moe::mixture;


// What one layer's forward keeps for its backward. Shapes use N = B·T tokens; under tensor
// parallelism n = N/tp rows of this rank's shard, Ha = nh·hd/tp (its heads: H/tp for DeepSeek),
// I = intermediate_size/tp.
struct Model::LayerActs {
  Buffer<float> x;          // [n,H] layer input (residual stream): always kept
  Buffer<float> ln1;        // [N,H] rmsnorm(x), gathered over TP (the q/k/v input)
  Buffer<float> rstd1;      // [n]
  Buffer<float> q, k, v;    // [N,Ha] after rope (q, k); k, v repeated to nh heads under GQA; MLA: in `mla`
  QkvKept qkv;              // QK-norm (qwen3_moe): q, k before their norm, and its rstd
  Buffer<float> att;        // attention_saved_floats: row LSE [B,nh,T] + a copy of out [N,Ha]
  Buffer<float> attn_out;   // [N,Ha] heads concatenated, before o_proj
  Buffer<float> h;          // [n,H] x + attention
  Buffer<float> ln2;        // rmsnorm(h), the FFN input: [n,H] for MoE, gathered [N,H] for dense
  Buffer<float> rstd2;      // [n]
  Buffer<float> mlp_g, mlp_u, mlp_h;  // [N,I] dense SwiGLU
  MlaActs mla;              // DeepSeek-V2/V3's attention (config.uses_mla())
  mx::MoeActivations moe;   // MoE layer
  std::vector<int32_t> topk_first;  // [N,k] routing of the first forward (checked on recompute)
  bool complete = false;    // everything backward needs is present
};

class Model::MicroBatch {
 private:
  friend class Model;
  int B = 0, T = 0;
  Buffer<int32_t> inputs, targets;                    // [n] on the model's device (this shard's)
  std::vector<std::unique_ptr<LayerActs>> layers;     // this stage's layers, in order
  std::vector<std::vector<int>> loads;                // [moe layers][E]
  size_t moe_dispatch_bytes = 0;                      // see Model::moe_dispatch_bytes
  int dropped = 0;
  Buffer<float> final_in, final_ln, final_rstd, logits, probs, losses;
  // Multi-token prediction (Model::has_mtp()): the module's input rows, its block, its head.
  std::unique_ptr<LayerActs> mtp_layer;             // the block (layer num_hidden_layers)
  Buffer<float> mtp_e, mtp_en, mtp_rstd_e, mtp_hn, mtp_rstd_h;  // [n,H] embed(t+1), the norms
  Buffer<float> mtp_out;                            // [n,H] the block's output (norm' reads it)
  Buffer<float> mtp_ln, mtp_rstd, mtp_logits, mtp_probs, mtp_losses;
  Buffer<int32_t> mtp_targets;                      // [n] token t+2 (0 where there is none)
  std::vector<int> mtp_masked;                      // rows without a token t+2 (t = T-1)
  float mtp_row_scale = 0.0f;                       // d(mtp loss)/d(a valid row's ce)
  LossParts loss;
  bool have = false;                                  // kept for backward
};

mx::MoeConfig moe_config(const ModelConfig& c, const MoeOptions& o, const mx::ExpertParallel* ep,
                         const balance::LayerPlacement* placement, MemTracker* scratch,
                         const float* score_bias_E) {
  mx::MoeConfig m;
  m.hidden = c.hidden_size;
  m.ffn = c.moe_intermediate_size;
  m.num_experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  m.shared_ffn = c.shared_ffn();
  m.norm_topk_prob = c.norm_topk_prob;
  m.aux_loss_alpha = c.router_aux_alpha();
  m.seq_aux = c.seq_aux;
  m.sigmoid = c.scoring_func == "sigmoid";
  m.score_bias_E = score_bias_E;
  m.routed_scaling_factor = c.routed_scaling_factor;
  m.n_group = c.n_group;
  m.topk_group = c.topk_group;
  m.capacity_factor = o.capacity_factor;
  m.padded = o.padded;
  m.ep = ep;
  m.placement = placement;
  m.scratch_tracker = scratch;
  return m;
}

mx::MoeWeights moe_weights(const LayerTensors& L) {
  mx::MoeWeights w;
  w.gate_EH = L.router;
  w.experts = {L.experts_gate, L.experts_up, L.experts_down};
  w.shared = {L.shared_gate, L.shared_up, L.shared_down};
  w.shared_gate_H = L.shared_expert_gate;
  return w;
}

namespace {

mx::MoeGrads moe_grads(const LayerTensors& L) {
  mx::MoeGrads g;
  g.gate_EH = L.router;
  g.experts = {L.experts_gate, L.experts_up, L.experts_down};
  g.shared = {L.shared_gate, L.shared_up, L.shared_down};
  g.shared_gate_H = L.shared_expert_gate;
  return g;
}

QkvWeights qkv_weights(const LayerTensors& L) {
  return {L.q, L.k, L.v, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm};
}

QkvGrads qkv_grads(const LayerTensors& L) {
  return {L.q, L.k, L.v, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm};
}

}  // namespace

namespace {
balance::Placement placement_of(const ModelConfig& c, const mx::ExpertParallel* ep) {
  if (!ep) return {};
  MOE_CHECK(ep->size >= 1 && c.n_routed_experts % ep->size == 0, "expert parallelism over ",
            ep->size, " ranks does not divide n_routed_experts (", c.n_routed_experts, ")");
  std::vector<bool> is_moe(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) is_moe[l] = c.is_moe_layer(l);
  return balance::Placement::contiguous(is_moe, c.n_routed_experts, ep->size);
}
}  // namespace

namespace {
TpShard tp_shard_of(const ModelConfig& c, const TensorParallel* tp) {
  if (!tp || tp->size == 1) return {};
  MOE_CHECK(tp->group && tp->group->size() == tp->size && tp->group->rank() == tp->rank,
            "tensor parallelism: rank ", tp->rank, " of ", tp->size, " needs its TP group");
  MOE_CHECK(c.num_attention_heads % tp->size == 0, "tensor parallelism ", tp->size,
            " does not divide num_attention_heads (", c.num_attention_heads, ")");
  MOE_CHECK(c.kv_heads() % tp->size == 0, "tensor parallelism ", tp->size,
            " does not divide num_key_value_heads (", c.kv_heads(), ")");
  return {tp->rank, tp->size};
}
}  // namespace

Model::Model(const ModelConfig& config, MoeOptions moe_options, const mx::ExpertParallel* ep,
             StageSpec stage, Recompute recompute, const TensorParallel* tp)
    : config_(config),
      moe_options_(moe_options),
      ep_(ep),
      recompute_(recompute),
      tp_(tp && tp->size > 1 ? tp : nullptr),
      dev_(kernels::active_device()),
      placement_(placement_of(config, ep)),
      layout_(config, ep ? ExpertShard::of(placement_, ep->rank) : ExpertShard{}, stage,
              tp_shard_of(config, tp)) {
  config_.validate();
  act_mem_.set_parent(&total_mem_);
  work_mem_.set_parent(&total_mem_);
  params_.resize(layout_.total(), &total_mem_, dev_);
  grads_.resize(layout_.total(), &total_mem_, dev_);
  w_ = bind_tensors(layout_, config_, params_.data());
  g_ = bind_tensors(layout_, config_, grads_.data());
  // Multi-head latent attention rotates its qk_rope_head_dim columns only (YaRN-scaled on request).
  rope_ = config_.uses_mla() ? mla_rope_table(config_)
                             : k::make_rope_table(config_.max_position_embeddings, config_.head_dim(),
                                                  config_.rope_theta);
  if (config_.aux_free_balancing()) {
    // The MTP block's row stays zero: its selection bias is not updated (train/score_bias.h
    // balances the main layers).
    score_bias_.resize(static_cast<size_t>(config_.num_hidden_layers + config_.num_nextn_predict_layers) *
                           config_.n_routed_experts,
                       &total_mem_, dev_);
    score_bias_.zero();
  }
  if (dev_ == Device::kCuda) k::cuda_scratch_memory().reparent(&work_mem_);
}

void Model::set_placement(const balance::Placement& placement) {
  MOE_CHECK(ep_, "set_placement: the model has no expert parallelism");
  MOE_CHECK(placement.layers.size() == placement_.layers.size(), "set_placement: a placement of ",
            placement.layers.size(), " layers for a model of ", placement_.layers.size());
  for (size_t l = 0; l < placement.layers.size(); ++l)
    MOE_CHECK(placement.layers[l].num_experts() == placement_.layers[l].num_experts() &&
                  placement.layers[l].ep_size() == placement_.layers[l].ep_size(),
              "set_placement: layer ", l, " places ", placement.layers[l].num_experts(), " experts over ",
              placement.layers[l].ep_size(), " ranks, the model has ", placement_.layers[l].num_experts(),
              " over ", placement_.layers[l].ep_size());
  ParamLayout renamed(config_, ExpertShard::of(placement, ep_->rank), layout_.stage(), layout_.tp());
  MOE_CHECK(renamed.total() == layout_.total(), "set_placement: the layout changed size");
  placement_ = placement;
  layout_ = std::move(renamed);  // same offsets and shapes: the bound tensors stay valid
}

const float* Model::layer_score_bias(int layer) const {
  if (score_bias_.size() == 0 || !config_.is_moe_layer(layer)) return nullptr;
  return score_bias_.data() + static_cast<size_t>(layer) * config_.n_routed_experts;
}

void Model::set_score_bias(int layer, const float* bias_E) {
  MOE_CHECK(layer_score_bias(layer), "set_score_bias: layer ", layer,
            " is not an MoE layer with a selection bias (topk_method noaux_tc)");
  const size_t E = config_.n_routed_experts;
  device_copy(dev_, score_bias_.data() + layer * E, Device::kCpu, bias_E, E * sizeof(float));
}

std::vector<float> Model::score_bias(int layer) const {
  MOE_CHECK(layer_score_bias(layer), "score_bias: layer ", layer,
            " is not an MoE layer with a selection bias (topk_method noaux_tc)");
  std::vector<float> out(config_.n_routed_experts);
  device_copy(Device::kCpu, out.data(), dev_, layer_score_bias(layer), out.size() * sizeof(float));
  return out;
}

Model::~Model() {
  if (k::cuda_scratch_memory().parent() == &work_mem_) k::cuda_scratch_memory().reparent(nullptr);
}

Model::MicroBatchPtr Model::new_micro_batch() { return MicroBatchPtr(new MicroBatch()); }

void Model::MicroBatchDeleter::operator()(MicroBatch* mb) const { delete mb; }

namespace {
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

void Model::init_weights(uint64_t seed) {
  // One random stream per tensor, keyed by its name: a tensor's initial values do not depend on
  // which other tensors a rank holds (expert parallelism initialises only its own experts).
  // Generated on the host (the same numbers on every device), one tensor at a time.
  // A tensor split by tensor parallelism draws the whole logical tensor and keeps its slice.
  const float std = config_.initializer_range;
  std::vector<float> host, full;
  for (const ParamSpec& s : layout_.specs()) {
    host.resize(s.numel);
    float* p = host.data();
    if (s.shape.size() == 1) {
      // Norm weights 1; the q/k/v biases (qwen2_moe) 0, as HF initialises a Linear's bias.
      const bool bias = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
      for (size_t i = 0; i < s.numel; ++i) p[i] = bias ? 0.0f : 1.0f;
    } else {
      Rng rng = derive_rng(seed, fnv1a(s.name));
      float* draw = p;
      if (s.tp_dim >= 0) {
        full.resize(static_cast<size_t>(s.full_shape[0]) * s.full_shape[1]);
        draw = full.data();
      }
      const size_t n = s.tp_dim >= 0 ? full.size() : s.numel;
      for (size_t i = 0; i < n; ++i) draw[i] = static_cast<float>(std * rng.normal());
      if (s.tp_dim >= 0) {
        const size_t rows = s.shape[0], cols = s.shape[1], full_cols = s.full_shape[1];
        const size_t r0 = s.tp_dim == 0 ? rows * tp_rank() : 0, c0 = s.tp_dim == 1 ? cols * tp_rank() : 0;
        for (size_t i = 0; i < rows; ++i)
          std::memcpy(p + i * cols, full.data() + (r0 + i) * full_cols + c0, cols * sizeof(float));
      }
    }
    device_copy(dev_, params_.data() + s.offset, Device::kCpu, p, s.numel * sizeof(float));
  }
}

double Model::flops_per_token(int T) const {
  ParamCounts pc = count_params(config_);
  double n_active = static_cast<double>(pc.active) -
                    static_cast<double>(config_.vocab_size) * config_.hidden_size;  // lookup only
  // Scores and the weighted sum: 2·T·nh·(qk + v head widths) a token forward, 3x with backward
  // (12·L·H·T when both widths are H/nh).
  const double widths = static_cast<double>(config_.num_attention_heads) *
                        (config_.qk_head_dim() + config_.value_head_dim());
  return 6.0 * n_active + 6.0 * config_.num_hidden_layers * widths * T;
}

Model::Keep Model::keep_mode(int l) const {
  switch (recompute_) {
    case Recompute::kNone: return Keep::kAll;
    case Recompute::kMoe: return config_.is_moe_layer(l) ? Keep::kNoMoe : Keep::kAll;
    case Recompute::kFull: return Keep::kInput;
  }
  return Keep::kAll;
}

void Model::tp_allgather(float* full, size_t shard_elems) const {
  if (!tp_) return;
  tp_->group->allgatherv(full, std::vector<int>(tp_->size, static_cast<int>(shard_elems)));
}

void Model::tp_reduce_scatter(float* full, size_t shard_elems) const {
  if (!tp_) return;
  tp_->group->reduce_scatter_sum(full, std::vector<int>(tp_->size, static_cast<int>(shard_elems)));
}

void Model::row_parallel_add(float* y, const float* x, const float* w, int N, int in, int H) {
  if (!tp_) {
    k::linear_forward(y, x, w, N, in, H, /*accumulate=*/true);
    return;
  }
  const size_t shard = static_cast<size_t>(N / tp_->size) * H;
  Buffer<float> partial(static_cast<size_t>(N) * H, &work_mem_, dev_);
  k::linear_forward(partial.data(), x, w, N, in, H);
  tp_reduce_scatter(partial.data(), shard);
  k::add_inplace(y, partial.data() + shard * tp_->rank, shard);
}

int Model::moe_sequences(int B) const {
  // Only the router's seq_aux statistics count sequences; forward checks that a shard then holds
  // whole ones.
  return B % tp_size() == 0 ? B / tp_size() : 1;
}

void Model::layer_forward(int l, LayerActs& a, float* out, int B, int T, MemTracker* mem) {
  const ModelConfig& c = config_;
  const LayerTensors& W = w_.layers[l];
  const int tp = tp_size(), N = B * T, n = N / tp, H = c.hidden_size, hd = c.head_dim();
  const int nh = c.num_attention_heads / tp, Ha = nh * c.value_head_dim();  // this rank's heads, their width
  const int nkv = c.kv_heads() / tp;                         // this rank's key/value heads
  const int I = c.intermediate_size / tp;
  const size_t NH = static_cast<size_t>(N) * H, nH = static_cast<size_t>(n) * H;
  const size_t NA = static_cast<size_t>(N) * Ha, mine = nH * tp_rank();  // this shard's rows
  const bool moe = c.is_moe_layer(l);
  // The normed shard goes into its rows of the gathered [N,H] that q, k, v read.
  a.ln1.resize_for_overwrite(NH, mem, dev_);
  a.rstd1.resize_for_overwrite(n, mem, dev_);
  k::rmsnorm_forward(a.ln1.data() + mine, a.rstd1.data(), a.x.data(), W.input_norm, n, H, c.rms_norm_eps);
  tp_allgather(a.ln1.data(), nH);
  a.attn_out.resize_for_overwrite(NA, mem, dev_);
  if (c.uses_mla()) {
    const k::Bf16InputScope ln1_once(a.ln1.data(), NH);  // q (or q_a) and kv_a read the same rows
    mla_forward(a.mla, a.attn_out.data(), a.ln1.data(), W, c, nh, B, T, rope_, mem, &work_mem_, dev_);
  } else {
    a.q.resize_for_overwrite(NA, mem, dev_);
    a.k.resize_for_overwrite(NA, mem, dev_);
    a.v.resize_for_overwrite(NA, mem, dev_);
    {  // q, k, v (model/attention_proj.h); grouped-query attention: k, v of nkv heads, repeated
      const QkvDims d{B, T, H, nh, nkv, hd};
      Buffer<float> k_kv, v_kv;  // [N,Akv] (GQA only; MHA writes a.k, a.v directly)
      if (nkv != nh) {
        k_kv.resize_for_overwrite(static_cast<size_t>(N) * d.Akv(), &work_mem_, dev_);
        v_kv.resize_for_overwrite(static_cast<size_t>(N) * d.Akv(), &work_mem_, dev_);
      }
      float* kp = nkv != nh ? k_kv.data() : a.k.data();
      float* vp = nkv != nh ? v_kv.data() : a.v.data();
      qkv_forward(a.q.data(), kp, vp, &a.qkv, a.ln1.data(), qkv_weights(W), d, rope_, c.rms_norm_eps,
                  qkv_scratch_, mem, &work_mem_);
      if (nkv != nh) {
        repeat_kv(a.k.data(), kp, d, qkv_scratch_);
        repeat_kv(a.v.data(), vp, d, qkv_scratch_);
      }
    }
    a.att.resize_for_overwrite(k::attention_saved_floats(B, T, nh, hd), mem, dev_);
    k::attention_forward(a.attn_out.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T,
                         nh, hd);
  }
  a.h.resize_for_overwrite(nH, mem, dev_);
  kernels::copy(a.h.data(), a.x.data(), a.h.size());
  row_parallel_add(a.h.data(), a.attn_out.data(), W.o, N, Ha, H);
  // MoE: the block runs on the shard (SSMB). Dense: the normed shard is gathered for gate/up.
  a.ln2.resize_for_overwrite(moe ? nH : NH, mem, dev_);
  a.rstd2.resize_for_overwrite(n, mem, dev_);
  k::rmsnorm_forward(a.ln2.data() + (moe ? 0 : mine), a.rstd2.data(), a.h.data(), W.post_norm, n, H,
                     c.rms_norm_eps);
  if (moe) {
    kernels::fill_zero(out, nH);
    mx::moe_forward(out, a.moe, a.ln2.data(), moe_weights(W),
                    moe_config(c, moe_options_, layer_ep(l), layer_placement(l), &work_mem_, layer_score_bias(l)),
                    n, moe_sequences(B), mem);
    k::add_inplace(out, a.h.data(), nH);
  } else {
    tp_allgather(a.ln2.data(), nH);
    a.mlp_g.resize_for_overwrite(static_cast<size_t>(N) * I, mem, dev_);
    a.mlp_u.resize_for_overwrite(static_cast<size_t>(N) * I, mem, dev_);
    a.mlp_h.resize_for_overwrite(static_cast<size_t>(N) * I, mem, dev_);
    kernels::copy(out, a.h.data(), nH);
    if (!tp_) {
      k::swiglu_mlp_forward(out, a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(), a.ln2.data(),
                            {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, /*accumulate=*/true);
    } else {
      Buffer<float> partial(NH, &work_mem_, dev_);
      k::swiglu_mlp_forward(partial.data(), a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(), a.ln2.data(),
                            {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I);
      tp_reduce_scatter(partial.data(), nH);
      k::add_inplace(out, partial.data() + mine, nH);
    }
  }
  a.complete = true;
}

void Model::drop_activations(LayerActs& a, Keep keep) {
  if (keep == Keep::kAll) return;
  if (config_.n_routed_experts > 0) {
    // Kept to check that the recomputation routes exactly as this forward did.
    const auto& idx = a.moe.routing.topk_idx_TK;
    a.topk_first.resize(idx.size());
    device_copy(Device::kCpu, a.topk_first.data(), idx.device(), idx.data(), idx.bytes());
  }
  a.complete = false;
  a.moe = mx::MoeActivations{};  // MoE activations are recomputed in both modes
  if (keep == Keep::kNoMoe) return;
  for (Buffer<float>* b : {&a.ln1, &a.rstd1, &a.q, &a.k, &a.v, &a.att, &a.attn_out, &a.h, &a.ln2,
                           &a.rstd2, &a.mlp_g, &a.mlp_u, &a.mlp_h, &a.qkv.q_raw, &a.qkv.k_raw,
                           &a.qkv.q_rstd, &a.qkv.k_rstd})
    b->release();
  for (Buffer<float>* b : a.mla.buffers()) b->release();
}

void Model::layer_backward(int l, LayerActs& a, float* dx, int B, int T, float loss_scale) {
  const ModelConfig& c = config_;
  const LayerTensors& W = w_.layers[l];
  const LayerTensors& G = g_.layers[l];
  const int tp = tp_size(), N = B * T, n = N / tp, H = c.hidden_size, hd = c.head_dim();
  const int nh = c.num_attention_heads / tp, Ha = nh * c.value_head_dim(), nkv = c.kv_heads() / tp;
  const int I = c.intermediate_size / tp;
  const size_t NH = static_cast<size_t>(N) * H, nH = static_cast<size_t>(n) * H;
  const size_t NA = static_cast<size_t>(N) * Ha, mine = nH * tp_rank();
  MemTracker* work = &work_mem_;
  const bool moe = c.is_moe_layer(l);
  if (!a.complete) {
    // Recompute from the kept input (full) or the kept FFN input (moe); charged to work memory.
    Buffer<float> out(nH, work, dev_);
    if (!a.ln2.data()) {
      layer_forward(l, a, out.data(), B, T, work);
    } else {
      MOE_CHECK(moe, "internal: layer ", l, " lost activations it cannot recompute");
      mx::moe_forward(out.data(), a.moe, a.ln2.data(), moe_weights(W),
                      moe_config(c, moe_options_, layer_ep(l), layer_placement(l), &work_mem_, layer_score_bias(l)), n,
                      moe_sequences(B), work);
      a.complete = true;
    }
    if (moe) {
      const auto& idx = a.moe.routing.topk_idx_TK;
      std::vector<int32_t> now(idx.size());
      device_copy(Device::kCpu, now.data(), idx.device(), idx.data(), idx.bytes());
      MOE_CHECK(a.topk_first == now,
                "layer ", l, ": recomputed routing differs from the first forward");
    }
  }
  // d(out) of a row-parallel linear, gathered over TP: every rank's rows (dx itself without TP).
  Buffer<float> dy_full(tp_ ? NH : 0, work, dev_);
  auto gathered = [&](const float* shard) -> const float* {
    if (!tp_) return shard;
    kernels::copy(dy_full.data() + mine, shard, nH);
    tp_allgather(dy_full.data(), nH);
    return dy_full.data();
  };
  Buffer<float> dln(moe ? nH : NH, work, dev_);
  // FFN branch: out = h + ffn(ln2(h)); dx holds d(out).
  if (moe) {
    mx::MoeConfig cfg = moe_config(c, moe_options_, layer_ep(l), layer_placement(l), &work_mem_, layer_score_bias(l));
    cfg.workspace = &moe_work_;
    mx::moe_backward(dln.data(), moe_grads(G), dx, /*aux_grad=*/loss_scale, a.moe, a.ln2.data(),
                     moe_weights(W), cfg, n, moe_sequences(B));
  } else {
    Buffer<float> scratch(2 * static_cast<size_t>(N) * I, work, dev_);
    k::swiglu_mlp_backward(dln.data(), {G.mlp_gate, G.mlp_up, G.mlp_down}, gathered(dx), a.ln2.data(),
                           a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(),
                           {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, scratch.data());
    tp_reduce_scatter(dln.data(), nH);
  }
  k::rmsnorm_backward(dx, G.post_norm, dln.data() + (moe ? 0 : mine), a.h.data(), W.post_norm,
                      a.rstd2.data(), n, H);
  // Attention branch: h = x + o_proj(attn); dx now holds d(h).
  Buffer<float> dattn(NA, work, dev_);
  k::linear_backward(dattn.data(), G.o, gathered(dx), a.attn_out.data(), W.o, N, Ha, H);
  if (dln.size() == NH)
    dln.zero();
  else
    dln.resize(NH, work, dev_);
  if (c.uses_mla()) {
    const k::Bf16InputScope ln1_once(a.ln1.data(), NH);
    mla_backward(dln.data(), G, dattn.data(), a.mla, a.ln1.data(), W, c, nh, B, T, rope_, work, dev_);
  } else {
    Buffer<float> dq(NA, work, dev_), dk(NA, work, dev_), dv(NA, work, dev_);
    Buffer<float> att_scratch(k::attention_scratch_floats(T), work, dev_);
    k::attention_backward(dq.data(), dk.data(), dv.data(), dattn.data(), a.q.data(), a.k.data(),
                          a.v.data(), a.att.data(), B, T, nh, hd, att_scratch.data());
    // back through the projections; grouped-query attention: dk, dv summed over each group first
    const QkvDims d{B, T, H, nh, nkv, hd};
    Buffer<float> dk_kv, dv_kv;
    if (nkv != nh) {
      dk_kv.resize(static_cast<size_t>(N) * d.Akv(), work, dev_);
      dv_kv.resize(static_cast<size_t>(N) * d.Akv(), work, dev_);
      repeat_kv_backward(dk_kv.data(), dk.data(), d, qkv_scratch_);
      repeat_kv_backward(dv_kv.data(), dv.data(), d, qkv_scratch_);
    }
    qkv_backward(dln.data(), qkv_grads(G), dq.data(), nkv != nh ? dk_kv.data() : dk.data(),
                 nkv != nh ? dv_kv.data() : dv.data(), a.qkv, a.ln1.data(), qkv_weights(W), d, rope_,
                 qkv_scratch_, work);
  }
  tp_reduce_scatter(dln.data(), nH);
  k::rmsnorm_backward(dx, G.input_norm, dln.data() + mine, a.x.data(), W.input_norm, a.rstd1.data(), n, H);
}

LossParts Model::forward(MicroBatch& mb, const int32_t* tokens_BT1, const float* x_in, float* x_out,
                         int B, int T, bool keep) {
  const ModelConfig& c = config_;
  const StageSpec& st = layout_.stage();
  MOE_CHECK(B > 0 && T > 0, "forward: batch (", B, ") and sequence length (", T, ") must be positive");
  MOE_CHECK(T <= c.max_position_embeddings, "sequence length ", T, " exceeds max_position_embeddings ",
            c.max_position_embeddings);
  // The attention is full causal: a sliding window shorter than the sequence would change it.
  MOE_CHECK(attention_window(c) == 0 || T <= attention_window(c), "sequence length ", T,
            " exceeds sliding_window ", attention_window(c), " (", c.model_type,
            "): windowed attention is not supported");
  MOE_CHECK(st.embedding || x_in, "forward: a stage without the embedding needs its input x_in");
  MOE_CHECK(st.head || x_out, "forward: a stage without the head needs an output buffer x_out");
  const int tp = tp_size();
  MOE_CHECK(T % tp == 0, "sequence length ", T, " does not split over tensor parallelism ", tp);
  // The router's per-sequence aux statistics (seq_aux) need whole sequences on each shard.
  MOE_CHECK(!(c.seq_aux && c.router_aux_alpha() > 0 && c.n_routed_experts > 0) || B % tp == 0,
            "seq_aux: the batch of ", B, " sequences does not split over tensor parallelism ", tp,
            " (each TP rank's shard must hold whole sequences)");
  const int N = B * T, n = N / tp, H = c.hidden_size, V = c.vocab_size;
  const size_t nH = static_cast<size_t>(n) * H;
  MemTracker* mem = keep ? &act_mem_ : &work_mem_;
  mb = MicroBatch{};
  mb.B = B;
  mb.T = T;
  // This TP rank's rows [n·rank, n·(rank + 1)) of the flat B·T tokens.
  std::vector<int32_t> inputs(n), targets(n);
  for (int i = 0; i < n; ++i) {
    const int row = n * tp_rank() + i, b = row / T, t = row % T;
    int32_t in = tokens_BT1[b * (T + 1) + t], tg = tokens_BT1[b * (T + 1) + t + 1];
    MOE_CHECK(in >= 0 && in < V && tg >= 0 && tg < V, "token id ", (in < 0 || in >= V) ? in : tg,
              " is outside the vocabulary [0, ", V, ")");
    inputs[i] = in;
    targets[i] = tg;
  }
  mb.inputs.resize(n, nullptr, dev_);
  mb.targets.resize(n, nullptr, dev_);
  device_copy(dev_, mb.inputs.data(), Device::kCpu, inputs.data(), n * sizeof(int32_t));
  device_copy(dev_, mb.targets.data(), Device::kCpu, targets.data(), n * sizeof(int32_t));

  // The residual stream, each layer's output and the head's buffers are written whole before
  // they are read: not zeroed (about 18 MB a step of the tiny model).
  Buffer<float> x;
  x.resize_for_overwrite(nH, mem, dev_);
  if (st.embedding) {
    k::embedding_forward(x.data(), mb.inputs.data(), w_.embed, n, H);
  } else {
    kernels::copy(x.data(), x_in, nH);
  }
  LossParts loss;
  for (int l = st.first_layer; l < st.end_layer(c); ++l) {
    auto a = std::make_unique<LayerActs>();
    a->x = std::move(x);
    // The stage's last output goes to x_out (the pipeline's buffer): a temporary, not kept.
    const bool stage_output = l + 1 == st.end_layer(c) && !st.head;
    Buffer<float> out;  // layer_forward writes it whole (MoE: zeroed there, then summed into)
    out.resize_for_overwrite(nH, stage_output ? &work_mem_ : mem, dev_);
    // A layer that keeps only part of its activations computes them as workspace; what it keeps
    // moves to the activation tracker, so its peak is exactly what is held for backward.
    const Keep km = keep ? keep_mode(l) : Keep::kAll;
    layer_forward(l, *a, out.data(), B, T, km == Keep::kAll ? mem : &work_mem_);
    if (c.is_moe_layer(l)) {
      loss.aux += a->moe.aux_loss;
      const auto& n = a->moe.layout.num_tokens_per_expert_E;
      mb.loads.emplace_back(n.data(), n.data() + n.size());
      mb.dropped += a->moe.layout.num_dropped;
      const mx::MoeActivations& ma = a->moe;
      for (const Buffer<float>* r : {&ma.x_rows, &ma.g, &ma.u, &ma.h, &ma.y_rows, &ma.shared_g,
                                     &ma.shared_u, &ma.shared_h})
        mb.moe_dispatch_bytes += r->bytes();
    }
    x = std::move(out);
    if (keep) {
      drop_activations(*a, km);
      if (km != Keep::kAll)
        for (Buffer<float>* b : {&a->ln1, &a->rstd1, &a->q, &a->k, &a->v, &a->att, &a->attn_out,
                                 &a->h, &a->ln2, &a->rstd2, &a->mlp_g, &a->mlp_u, &a->mlp_h,
                                 &a->qkv.q_raw, &a->qkv.k_raw, &a->qkv.q_rstd, &a->qkv.k_rstd})
          b->set_tracker(mem);
      if (km != Keep::kAll)
        for (Buffer<float>* b : a->mla.buffers()) b->set_tracker(mem);
      mb.layers.push_back(std::move(a));
    }
  }
  if (st.head) {
    mb.final_in = std::move(x);
    mb.final_ln.resize_for_overwrite(nH, mem, dev_);
    mb.final_rstd.resize_for_overwrite(n, mem, dev_);
    k::rmsnorm_forward(mb.final_ln.data(), mb.final_rstd.data(), mb.final_in.data(), w_.norm, n, H,
                       c.rms_norm_eps);
    mb.logits.resize_for_overwrite(static_cast<size_t>(n) * V, mem, dev_);
    k::linear_forward(mb.logits.data(), mb.final_ln.data(), w_.lm_head, n, H, V);
    mb.probs.resize_for_overwrite(static_cast<size_t>(n) * V, mem, dev_);
    mb.losses.resize_for_overwrite(n, mem, dev_);
    loss.ce = k::cross_entropy_forward(mb.losses.data(), mb.probs.data(), mb.logits.data(),
                                       mb.targets.data(), n, V);
    if (has_mtp() && keep) {
      loss.mtp = mtp_forward(mb, tokens_BT1, mem);
      loss.mtp_weight = mtp_weight_;
      // The block's balance loss counts like any MoE layer's (its backward adds its gradient).
      if (c.is_moe_layer(c.num_hidden_layers)) loss.aux += mb.mtp_layer->moe.aux_loss;
    }
  } else {
    kernels::copy(x_out, x.data(), nH);
  }
  loss.total = loss.ce + loss.aux + loss.mtp_weight * loss.mtp;
  mb.loss = loss;
  mb.have = keep;
  return loss;
}

double Model::mtp_forward(MicroBatch& mb, const int32_t* tokens_BT1, MemTracker* mem) {
  // DeepSeek-V3's MTP module (depth 1) on this shard's rows r (token t of sequence b):
  //   x' = block_L(eh_proj([enorm(embed(t+1)) | hnorm(h)])),  h = the main head's normed state
  //   loss = mean over rows with a token t+2 of ce(lm_head(norm'(x')), t+2)
  // The input h is the final-normed state the head reads (as vLLM's DeepSeek MTP reads the target
  // model's output); embed and lm_head are the main model's (shared).
  const ModelConfig& c = config_;
  const int B = mb.B, T = mb.T, tp = tp_size(), n = B * T / tp, H = c.hidden_size, V = c.vocab_size;
  const int L = c.num_hidden_layers;
  const size_t nH = static_cast<size_t>(n) * H;
  const MtpTensors& M = w_.mtp;
  std::vector<int32_t> tg(n);
  mb.mtp_masked.clear();
  for (int i = 0; i < n; ++i) {
    const int row = n * tp_rank() + i, b = row / T, t = row % T;
    if (t + 1 < T) {
      tg[i] = tokens_BT1[static_cast<size_t>(b) * (T + 1) + t + 2];  // checked as a target already
    } else {
      tg[i] = 0;
      mb.mtp_masked.push_back(i);
    }
  }
  mb.mtp_targets.resize(n, nullptr, dev_);
  device_copy(dev_, mb.mtp_targets.data(), Device::kCpu, tg.data(), n * sizeof(int32_t));
  // The module's input: embed(t+1) (the main targets) and the normed state, each normed again.
  for (Buffer<float>* b : {&mb.mtp_e, &mb.mtp_en, &mb.mtp_hn}) b->resize_for_overwrite(nH, mem, dev_);
  for (Buffer<float>* b : {&mb.mtp_rstd_e, &mb.mtp_rstd_h}) b->resize_for_overwrite(n, mem, dev_);
  k::embedding_forward(mb.mtp_e.data(), mb.targets.data(), w_.embed, n, H);
  k::rmsnorm_forward(mb.mtp_en.data(), mb.mtp_rstd_e.data(), mb.mtp_e.data(), M.enorm, n, H, c.rms_norm_eps);
  k::rmsnorm_forward(mb.mtp_hn.data(), mb.mtp_rstd_h.data(), mb.final_ln.data(), M.hnorm, n, H,
                     c.rms_norm_eps);
  mb.mtp_layer = std::make_unique<LayerActs>();
  LayerActs& a = *mb.mtp_layer;
  a.x.resize_for_overwrite(nH, mem, dev_);
  // eh_proj [H, 2H] over the concatenation, as two products into its column blocks.
  k::gemm(false, true, n, H, H, 1.0f, mb.mtp_en.data(), H, M.eh_proj, 2 * H, 0.0f, a.x.data(), H);
  k::gemm(false, true, n, H, H, 1.0f, mb.mtp_hn.data(), H, M.eh_proj + H, 2 * H, 1.0f, a.x.data(), H);
  Buffer<float> out;
  out.resize_for_overwrite(nH, mem, dev_);
  layer_forward(L, a, out.data(), B, T, mem);  // every activation kept, whatever --recompute says
  mb.mtp_ln.resize_for_overwrite(nH, mem, dev_);
  mb.mtp_rstd.resize_for_overwrite(n, mem, dev_);
  k::rmsnorm_forward(mb.mtp_ln.data(), mb.mtp_rstd.data(), out.data(), M.norm, n, H, c.rms_norm_eps);
  mb.mtp_logits.resize_for_overwrite(static_cast<size_t>(n) * V, mem, dev_);
  k::linear_forward(mb.mtp_logits.data(), mb.mtp_ln.data(), w_.lm_head, n, H, V);
  mb.mtp_probs.resize_for_overwrite(static_cast<size_t>(n) * V, mem, dev_);
  mb.mtp_losses.resize_for_overwrite(n, mem, dev_);
  k::cross_entropy_forward(mb.mtp_losses.data(), mb.mtp_probs.data(), mb.mtp_logits.data(),
                           mb.mtp_targets.data(), n, V);
  std::vector<float> row_loss(n);
  device_copy(Device::kCpu, row_loss.data(), dev_, mb.mtp_losses.data(), n * sizeof(float));
  for (int i : mb.mtp_masked) row_loss[i] = 0.0f;
  double sum = 0.0;
  for (float v : row_loss) sum += v;
  // Over the batch's B·(T-1) rows; a shard's part times tp, so the TP group's mean is the batch's.
  const double rows = static_cast<double>(B) * (T - 1);
  mb.mtp_row_scale = T > 1 ? static_cast<float>(tp / rows) : 0.0f;
  mb.mtp_out = std::move(out);
  return T > 1 ? sum * tp / rows : 0.0;
}

void Model::mtp_backward(MicroBatch& mb, float* d_final_ln, float loss_scale) {
  const ModelConfig& c = config_;
  const int B = mb.B, T = mb.T, n = B * T / tp_size(), H = c.hidden_size, V = c.vocab_size;
  const int L = c.num_hidden_layers;
  const size_t nH = static_cast<size_t>(n) * H;
  const MtpTensors& M = w_.mtp;
  const MtpTensors& MG = g_.mtp;
  MemTracker* work = &work_mem_;
  Buffer<float> dlogits(static_cast<size_t>(n) * V, work, dev_);
  k::cross_entropy_backward(dlogits.data(), mb.mtp_probs.data(), mb.mtp_targets.data(), n, V,
                            loss_scale * mtp_weight_ * mb.mtp_row_scale);
  for (int i : mb.mtp_masked) k::fill_zero(dlogits.data() + static_cast<size_t>(i) * V, V);
  Buffer<float> dln(nH, work, dev_), dx(nH, work, dev_);
  k::linear_backward(dln.data(), g_.lm_head, dlogits.data(), mb.mtp_ln.data(), w_.lm_head, n, H, V);
  k::rmsnorm_backward(dx.data(), MG.norm, dln.data(), mb.mtp_out.data(), M.norm, mb.mtp_rstd.data(), n, H);
  layer_backward(L, *mb.mtp_layer, dx.data(), B, T, loss_scale);  // dx: d(block input)
  Buffer<float> den(nH, work, dev_), dhn(nH, work, dev_);
  // y = en · W[:, :H]^T + hn · W[:, H:]^T: dW blocks += dy^T · input, d(input) = dy · W block.
  k::gemm(true, false, H, H, n, 1.0f, dx.data(), H, mb.mtp_en.data(), H, 1.0f, MG.eh_proj, 2 * H);
  k::gemm(true, false, H, H, n, 1.0f, dx.data(), H, mb.mtp_hn.data(), H, 1.0f, MG.eh_proj + H, 2 * H);
  k::gemm(false, false, n, H, H, 1.0f, dx.data(), H, M.eh_proj, 2 * H, 0.0f, den.data(), H);
  k::gemm(false, false, n, H, H, 1.0f, dx.data(), H, M.eh_proj + H, 2 * H, 0.0f, dhn.data(), H);
  Buffer<float> de(nH, work, dev_);
  k::rmsnorm_backward(de.data(), MG.enorm, den.data(), mb.mtp_e.data(), M.enorm, mb.mtp_rstd_e.data(), n, H);
  k::embedding_backward(g_.embed, de.data(), mb.targets.data(), n, H);
  k::rmsnorm_backward(d_final_ln, MG.hnorm, dhn.data(), mb.final_ln.data(), M.hnorm, mb.mtp_rstd_h.data(),
                      n, H);
}

void Model::backward(MicroBatch& mb, const float* dy_out, float* dx_in, float loss_scale) {
  MOE_CHECK(mb.have, "backward() called without a preceding forward() that kept activations");
  const ModelConfig& c = config_;
  const StageSpec& st = layout_.stage();
  MOE_CHECK(st.head || dy_out, "backward: a stage without the head needs the gradient dy_out");
  MOE_CHECK(st.embedding || dx_in, "backward: a stage without the embedding needs dx_in");
  // Under TP this shard's loss is 1/tp of the batch's: its rows count 1/(tp·n) each, as those of
  // one data-parallel rank among tp would.
  loss_scale /= static_cast<float>(tp_size());
  const int B = mb.B, T = mb.T, n = B * T / tp_size(), H = c.hidden_size, V = c.vocab_size;
  const size_t nH = static_cast<size_t>(n) * H;
  MemTracker* work = &work_mem_;

  Buffer<float> dx(nH, work, dev_);  // gradient of the residual stream
  if (st.head) {
    // Loss -> logits -> final norm.
    Buffer<float> dlogits(static_cast<size_t>(n) * V, work, dev_);
    k::cross_entropy_backward(dlogits.data(), mb.probs.data(), mb.targets.data(), n, V,
                              loss_scale / n);
    Buffer<float> dln(nH, work, dev_);
    k::linear_backward(dln.data(), g_.lm_head, dlogits.data(), mb.final_ln.data(), w_.lm_head, n, H, V);
    if (mb.mtp_layer) mtp_backward(mb, dln.data(), loss_scale);
    k::rmsnorm_backward(dx.data(), g_.norm, dln.data(), mb.final_in.data(), w_.norm,
                        mb.final_rstd.data(), n, H);
    for (Buffer<float>* b :
         {&mb.final_in, &mb.final_ln, &mb.final_rstd, &mb.logits, &mb.probs, &mb.losses, &mb.mtp_e,
          &mb.mtp_en, &mb.mtp_rstd_e, &mb.mtp_hn, &mb.mtp_rstd_h, &mb.mtp_ln, &mb.mtp_rstd,
          &mb.mtp_logits, &mb.mtp_probs, &mb.mtp_losses, &mb.mtp_out})
      b->release();
    mb.mtp_layer.reset();
  } else {
    kernels::copy(dx.data(), dy_out, nH);
  }
  for (int i = static_cast<int>(mb.layers.size()) - 1; i >= 0; --i) {
    layer_backward(st.first_layer + i, *mb.layers[i], dx.data(), B, T, loss_scale);
    mb.layers[i].reset();  // this layer's activations are no longer needed
  }
  if (st.embedding) {
    k::embedding_backward(g_.embed, dx.data(), mb.inputs.data(), n, H);
  } else {
    kernels::copy(dx_in, dx.data(), nH);
  }
  mb.layers.clear();
  mb.have = false;
}

LossParts Model::forward(const int32_t* tokens_BT1, int B, int T) {
  MOE_CHECK(layout_.stage().embedding && layout_.stage().head,
            "the whole-model forward needs a model holding every layer");
  whole_ = new_micro_batch();
  return forward(*whole_, tokens_BT1, nullptr, nullptr, B, T, true);
}

void Model::backward(float loss_scale) {
  MOE_CHECK(whole_, "backward() called without a preceding forward()");
  backward(*whole_, nullptr, nullptr, loss_scale);
}

LossParts Model::evaluate(const int32_t* tokens_BT1, int B, int T) {
  MOE_CHECK(layout_.stage().embedding && layout_.stage().head,
            "the whole-model evaluate needs a model holding every layer");
  whole_ = new_micro_batch();
  return forward(*whole_, tokens_BT1, nullptr, nullptr, B, T, false);
}

const float* Model::logits() const { return whole_ ? whole_->logits.data() : nullptr; }

std::vector<std::vector<int>> Model::expert_loads(const MicroBatch& mb) const { return mb.loads; }

size_t Model::moe_dispatch_bytes(const MicroBatch& mb) const { return mb.moe_dispatch_bytes; }

std::vector<std::vector<int>> Model::expert_loads() const {
  return whole_ ? whole_->loads : std::vector<std::vector<int>>{};
}

int Model::dropped_pairs() const { return whole_ ? whole_->dropped : 0; }

}  // namespace moe::model
