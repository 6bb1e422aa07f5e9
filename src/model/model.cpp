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
#include "model/model_internal.h"

namespace moe::model {

namespace k = moe::kernels;
namespace mx = moe::mixture;

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

namespace {
// The MoE block's tensors of a layer, as weights (const) or as gradients.
template <class M>
M moe_tensors(const LayerTensors& L) {
  M m;
  m.gate_EH = L.router;
  m.experts = {L.experts_gate, L.experts_up, L.experts_down};
  m.shared = {L.shared_gate, L.shared_up, L.shared_down};
  m.shared_gate_H = L.shared_expert_gate;
  return m;
}
}  // namespace

mx::MoeWeights moe_weights(const LayerTensors& L) { return moe_tensors<mx::MoeWeights>(L); }

mx::MoeGrads moe_grads(const LayerTensors& L) { return moe_tensors<mx::MoeGrads>(L); }

QkvWeights qkv_weights(const LayerTensors& L) {
  return {L.q, L.k, L.v, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm};
}

QkvGrads qkv_grads(const LayerTensors& L) {
  return {L.q, L.k, L.v, L.q_bias, L.k_bias, L.v_bias, L.q_norm, L.k_norm};
}

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
      placement_(placement_of(config, ep)),
      layout_(config, ep ? ExpertShard::of(placement_, ep->rank) : ExpertShard{}, stage,
              tp_shard_of(config, tp)),
      ctx_(kernels::active_device(), kernels::gemm_bf16()) {
  config_.validate();
  act_mem_.set_parent(&total_mem_);
  work_mem_.set_parent(&total_mem_);
  params_.resize(layout_.total(), &total_mem_, device());
  grads_.resize(layout_.total(), &total_mem_, device());
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
                       &total_mem_, device());
    score_bias_.zero();
  }
  ctx_.scratch_memory().set_parent(&work_mem_);
}

mx::MoeConfig Model::layer_moe_config(int l) {
  mx::MoeConfig cfg = moe_config(config_, moe_options_, layer_ep(l), layer_placement(l), &work_mem_,
                                 layer_score_bias(l));
  cfg.step_times = step_times_;
  return cfg;
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
  device_copy(device(), score_bias_.data() + layer * E, Device::kCpu, bias_E, E * sizeof(float));
}

std::vector<float> Model::score_bias(int layer) const {
  MOE_CHECK(layer_score_bias(layer), "score_bias: layer ", layer,
            " is not an MoE layer with a selection bias (topk_method noaux_tc)");
  std::vector<float> out(config_.n_routed_experts);
  device_copy(Device::kCpu, out.data(), device(), layer_score_bias(layer), out.size() * sizeof(float));
  return out;
}

Model::~Model() = default;

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
    device_copy(device(), params_.data() + s.offset, Device::kCpu, p, s.numel * sizeof(float));
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

LossParts Model::forward(MicroBatch& mb, const int32_t* tokens_BT1, const float* x_in, float* x_out,
                         int B, int T, bool keep) {
  const kernels::ContextScope on(ctx_);
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
  mb.inputs.resize(n, nullptr, device());
  mb.targets.resize(n, nullptr, device());
  device_copy(device(), mb.inputs.data(), Device::kCpu, inputs.data(), n * sizeof(int32_t));
  device_copy(device(), mb.targets.data(), Device::kCpu, targets.data(), n * sizeof(int32_t));

  // The residual stream, each layer's output and the head's buffers are written whole before
  // they are read: not zeroed (about 18 MB a step of the tiny model).
  Buffer<float> x;
  x.resize_for_overwrite(nH, mem, device());
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
    out.resize_for_overwrite(nH, stage_output ? &work_mem_ : mem, device());
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
    mb.final_ln.resize_for_overwrite(nH, mem, device());
    mb.final_rstd.resize_for_overwrite(n, mem, device());
    k::rmsnorm_forward(mb.final_ln.data(), mb.final_rstd.data(), mb.final_in.data(), w_.norm, n, H,
                       c.rms_norm_eps);
    mb.logits.resize_for_overwrite(static_cast<size_t>(n) * V, mem, device());
    k::linear_forward(mb.logits.data(), mb.final_ln.data(), w_.lm_head, n, H, V);
    mb.probs.resize_for_overwrite(static_cast<size_t>(n) * V, mem, device());
    mb.losses.resize_for_overwrite(n, mem, device());
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


void Model::backward(MicroBatch& mb, const float* dy_out, float* dx_in, float loss_scale) {
  const kernels::ContextScope on(ctx_);
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

  Buffer<float> dx(nH, work, device());  // gradient of the residual stream
  if (st.head) {
    // Loss -> logits -> final norm.
    Buffer<float> dlogits(static_cast<size_t>(n) * V, work, device());
    k::cross_entropy_backward(dlogits.data(), mb.probs.data(), mb.targets.data(), n, V,
                              loss_scale / n);
    Buffer<float> dln(nH, work, device());
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
