#include "model/model.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu_mlp.h"

namespace moe::model {

namespace k = moe::kernels;
namespace mx = moe::mixture;


// What one layer's forward keeps for its backward. Shapes use N = B·T tokens.
struct Model::LayerActs {
  Buffer<float> x;          // [N,H] layer input (residual stream): always kept
  Buffer<float> ln1;        // [N,H] rmsnorm(x)
  Buffer<float> rstd1;      // [N]
  Buffer<float> q, k, v;    // [N,H] after rope (q, k)
  Buffer<float> att;        // attention_saved_floats: row LSE [B,nh,T] + a copy of out [N,H]
  Buffer<float> attn_out;   // [N,H] heads concatenated, before o_proj
  Buffer<float> h;          // [N,H] x + attention
  Buffer<float> ln2;        // [N,H] rmsnorm(h): the FFN input
  Buffer<float> rstd2;      // [N]
  Buffer<float> mlp_g, mlp_u, mlp_h;  // [N,I] dense SwiGLU
  mx::MoeActivations moe;   // MoE layer
  std::vector<int32_t> topk_first;  // [N,k] routing of the first forward (checked on recompute)
  bool complete = false;    // everything backward needs is present
};

class Model::MicroBatch {
 private:
  friend class Model;
  int B = 0, T = 0;
  Buffer<int32_t> inputs, targets;                    // [N] on the model's device
  std::vector<std::unique_ptr<LayerActs>> layers;     // this stage's layers, in order
  std::vector<std::vector<int>> loads;                // [moe layers][E]
  int dropped = 0;
  Buffer<float> final_in, final_ln, final_rstd, logits, probs, losses;
  LossParts loss;
  bool have = false;                                  // kept for backward
};

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "moe") return Recompute::kMoe;
  if (name == "full") return Recompute::kFull;
  throw Error(str_cat("unknown recompute mode '", name, "' (expected none, moe or full)"));
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kMoe: return "moe";
    case Recompute::kFull: return "full";
  }
  return "?";
}

namespace {

mx::MoeConfig moe_config(const ModelConfig& c, const MoeOptions& o, const mx::ExpertParallel* ep,
                         const balance::LayerPlacement* placement, MemTracker* scratch,
                         const float* score_bias_E) {
  mx::MoeConfig m;
  m.hidden = c.hidden_size;
  m.ffn = c.moe_intermediate_size;
  m.num_experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  m.shared_ffn = c.moe_intermediate_size * c.n_shared_experts;
  m.norm_topk_prob = c.norm_topk_prob;
  m.aux_loss_alpha = c.aux_loss_alpha;
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
  return w;
}

mx::MoeGrads moe_grads(const LayerTensors& L) {
  mx::MoeGrads g;
  g.gate_EH = L.router;
  g.experts = {L.experts_gate, L.experts_up, L.experts_down};
  g.shared = {L.shared_gate, L.shared_up, L.shared_down};
  return g;
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

Model::Model(const ModelConfig& config, MoeOptions moe_options, const mx::ExpertParallel* ep,
             StageSpec stage, Recompute recompute)
    : config_(config),
      moe_options_(moe_options),
      ep_(ep),
      recompute_(recompute),
      dev_(kernels::active_device()),
      placement_(placement_of(config, ep)),
      layout_(config, ep ? ExpertShard::of(placement_, ep->rank) : ExpertShard{}, stage) {
  config_.validate();
  act_mem_.set_parent(&total_mem_);
  work_mem_.set_parent(&total_mem_);
  params_.resize(layout_.total(), &total_mem_, dev_);
  grads_.resize(layout_.total(), &total_mem_, dev_);
  w_ = bind_tensors(layout_, config_, params_.data());
  g_ = bind_tensors(layout_, config_, grads_.data());
  rope_ = k::make_rope_table(config_.max_position_embeddings, config_.head_dim(), config_.rope_theta);
  if (config_.aux_free_balancing()) {
    score_bias_.resize(static_cast<size_t>(config_.num_hidden_layers) * config_.n_routed_experts,
                       &total_mem_, dev_);
    score_bias_.zero();
  }
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
  ParamLayout renamed(config_, ExpertShard::of(placement, ep_->rank), layout_.stage());
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
  const float std = config_.initializer_range;
  std::vector<float> host;
  for (const ParamSpec& s : layout_.specs()) {
    host.resize(s.numel);
    float* p = host.data();
    if (s.shape.size() == 1) {
      for (size_t i = 0; i < s.numel; ++i) p[i] = 1.0f;  // norm weights
    } else {
      Rng rng = derive_rng(seed, fnv1a(s.name));
      for (size_t i = 0; i < s.numel; ++i) p[i] = static_cast<float>(std * rng.normal());
    }
    device_copy(dev_, params_.data() + s.offset, Device::kCpu, p, s.numel * sizeof(float));
  }
}

double Model::flops_per_token(int T) const {
  ParamCounts pc = count_params(config_);
  double n_active = static_cast<double>(pc.active) -
                    static_cast<double>(config_.vocab_size) * config_.hidden_size;  // lookup only
  return 6.0 * n_active + 12.0 * config_.num_hidden_layers * config_.hidden_size * T;
}

Model::Keep Model::keep_mode(int l) const {
  switch (recompute_) {
    case Recompute::kNone: return Keep::kAll;
    case Recompute::kMoe: return config_.is_moe_layer(l) ? Keep::kNoMoe : Keep::kAll;
    case Recompute::kFull: return Keep::kInput;
  }
  return Keep::kAll;
}

void Model::layer_forward(int l, LayerActs& a, float* out, int B, int T, MemTracker* mem) {
  const ModelConfig& c = config_;
  const LayerTensors& W = w_.layers[l];
  const int N = B * T, H = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim();
  const int I = c.intermediate_size;
  const size_t NH = static_cast<size_t>(N) * H;
  a.ln1.resize(NH, mem, dev_);
  a.rstd1.resize(N, mem, dev_);
  k::rmsnorm_forward(a.ln1.data(), a.rstd1.data(), a.x.data(), W.input_norm, N, H, c.rms_norm_eps);
  a.q.resize(NH, mem, dev_);
  a.k.resize(NH, mem, dev_);
  a.v.resize(NH, mem, dev_);
  k::linear_forward(a.q.data(), a.ln1.data(), W.q, N, H, H);
  k::linear_forward(a.k.data(), a.ln1.data(), W.k, N, H, H);
  k::linear_forward(a.v.data(), a.ln1.data(), W.v, N, H, H);
  k::rope_forward(a.q.data(), rope_, B, T, nh, hd);
  k::rope_forward(a.k.data(), rope_, B, T, nh, hd);
  a.att.resize(k::attention_saved_floats(B, T, nh, hd), mem, dev_);
  a.attn_out.resize(NH, mem, dev_);
  k::attention_forward(a.attn_out.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T,
                       nh, hd);
  a.h.resize(NH, mem, dev_);
  kernels::copy(a.h.data(), a.x.data(), a.h.size());
  k::linear_forward(a.h.data(), a.attn_out.data(), W.o, N, H, H, /*accumulate=*/true);
  a.ln2.resize(NH, mem, dev_);
  a.rstd2.resize(N, mem, dev_);
  k::rmsnorm_forward(a.ln2.data(), a.rstd2.data(), a.h.data(), W.post_norm, N, H, c.rms_norm_eps);
  if (c.is_moe_layer(l)) {
    kernels::fill_zero(out, NH);
    mx::moe_forward(out, a.moe, a.ln2.data(), moe_weights(W), moe_config(c, moe_options_, ep_, layer_placement(l), &work_mem_, layer_score_bias(l)), N, B,
                    mem);
    k::add_inplace(out, a.h.data(), NH);
  } else {
    a.mlp_g.resize(static_cast<size_t>(N) * I, mem, dev_);
    a.mlp_u.resize(static_cast<size_t>(N) * I, mem, dev_);
    a.mlp_h.resize(static_cast<size_t>(N) * I, mem, dev_);
    kernels::copy(out, a.h.data(), NH);
    k::swiglu_mlp_forward(out, a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(), a.ln2.data(),
                          {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, /*accumulate=*/true);
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
                           &a.rstd2, &a.mlp_g, &a.mlp_u, &a.mlp_h})
    b->release();
}

void Model::layer_backward(int l, LayerActs& a, float* dx, int B, int T, float loss_scale) {
  const ModelConfig& c = config_;
  const LayerTensors& W = w_.layers[l];
  const LayerTensors& G = g_.layers[l];
  const int N = B * T, H = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim();
  const int I = c.intermediate_size;
  const size_t NH = static_cast<size_t>(N) * H;
  MemTracker* work = &work_mem_;
  const bool moe = c.is_moe_layer(l);
  if (!a.complete) {
    // Recompute from the kept input (full) or the kept FFN input (moe); charged to work memory.
    Buffer<float> out(NH, work, dev_);
    if (!a.ln2.data()) {
      layer_forward(l, a, out.data(), B, T, work);
    } else {
      MOE_CHECK(moe, "internal: layer ", l, " lost activations it cannot recompute");
      mx::moe_forward(out.data(), a.moe, a.ln2.data(), moe_weights(W),
                      moe_config(c, moe_options_, ep_, layer_placement(l), &work_mem_, layer_score_bias(l)), N, B, work);
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
  Buffer<float> dln(NH, work, dev_);
  // FFN branch: out = h + ffn(ln2(h)); dx holds d(out).
  if (moe) {
    mx::moe_backward(dln.data(), moe_grads(G), dx, /*aux_grad=*/loss_scale, a.moe, a.ln2.data(),
                     moe_weights(W), moe_config(c, moe_options_, ep_, layer_placement(l), &work_mem_, layer_score_bias(l)), N, B);
  } else {
    Buffer<float> scratch(2 * static_cast<size_t>(N) * I, work, dev_);
    k::swiglu_mlp_backward(dln.data(), {G.mlp_gate, G.mlp_up, G.mlp_down}, dx, a.ln2.data(),
                           a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(),
                           {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, scratch.data());
  }
  k::rmsnorm_backward(dx, G.post_norm, dln.data(), a.h.data(), W.post_norm, a.rstd2.data(), N, H);
  // Attention branch: h = x + o_proj(attn); dx now holds d(h).
  Buffer<float> dattn(NH, work, dev_), dq(NH, work), dk(NH, work), dv(NH, work);
  Buffer<float> att_scratch(k::attention_scratch_floats(T), work, dev_);
  k::linear_backward(dattn.data(), G.o, dx, a.attn_out.data(), W.o, N, H, H);
  k::attention_backward(dq.data(), dk.data(), dv.data(), dattn.data(), a.q.data(), a.k.data(),
                        a.v.data(), a.att.data(), B, T, nh, hd, att_scratch.data());
  k::rope_backward(dq.data(), rope_, B, T, nh, hd);
  k::rope_backward(dk.data(), rope_, B, T, nh, hd);
  dln.zero();
  k::linear_backward(dln.data(), G.q, dq.data(), a.ln1.data(), W.q, N, H, H);
  k::linear_backward(dln.data(), G.k, dk.data(), a.ln1.data(), W.k, N, H, H);
  k::linear_backward(dln.data(), G.v, dv.data(), a.ln1.data(), W.v, N, H, H);
  k::rmsnorm_backward(dx, G.input_norm, dln.data(), a.x.data(), W.input_norm, a.rstd1.data(), N, H);
}

LossParts Model::forward(MicroBatch& mb, const int32_t* tokens_BT1, const float* x_in, float* x_out,
                         int B, int T, bool keep) {
  const ModelConfig& c = config_;
  const StageSpec& st = layout_.stage();
  MOE_CHECK(B > 0 && T > 0, "forward: batch (", B, ") and sequence length (", T, ") must be positive");
  MOE_CHECK(T <= c.max_position_embeddings, "sequence length ", T, " exceeds max_position_embeddings ",
            c.max_position_embeddings);
  MOE_CHECK(st.embedding || x_in, "forward: a stage without the embedding needs its input x_in");
  MOE_CHECK(st.head || x_out, "forward: a stage without the head needs an output buffer x_out");
  const int N = B * T, H = c.hidden_size, V = c.vocab_size;
  const size_t NH = static_cast<size_t>(N) * H;
  MemTracker* mem = keep ? &act_mem_ : &work_mem_;
  mb = MicroBatch{};
  mb.B = B;
  mb.T = T;
  std::vector<int32_t> inputs(N), targets(N);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      int32_t in = tokens_BT1[b * (T + 1) + t], tg = tokens_BT1[b * (T + 1) + t + 1];
      MOE_CHECK(in >= 0 && in < V && tg >= 0 && tg < V, "token id ", (in < 0 || in >= V) ? in : tg,
                " is outside the vocabulary [0, ", V, ")");
      inputs[b * T + t] = in;
      targets[b * T + t] = tg;
    }
  mb.inputs.resize(N, nullptr, dev_);
  mb.targets.resize(N, nullptr, dev_);
  device_copy(dev_, mb.inputs.data(), Device::kCpu, inputs.data(), N * sizeof(int32_t));
  device_copy(dev_, mb.targets.data(), Device::kCpu, targets.data(), N * sizeof(int32_t));

  Buffer<float> x(NH, mem, dev_);
  if (st.embedding) {
    k::embedding_forward(x.data(), mb.inputs.data(), w_.embed, N, H);
  } else {
    kernels::copy(x.data(), x_in, NH);
  }
  LossParts loss;
  for (int l = st.first_layer; l < st.end_layer(c); ++l) {
    auto a = std::make_unique<LayerActs>();
    a->x = std::move(x);
    // The stage's last output goes to x_out (the pipeline's buffer): a temporary, not kept.
    const bool stage_output = l + 1 == st.end_layer(c) && !st.head;
    Buffer<float> out(NH, stage_output ? &work_mem_ : mem, dev_);
    // A layer that keeps only part of its activations computes them as workspace; what it keeps
    // moves to the activation tracker, so its peak is exactly what is held for backward.
    const Keep km = keep ? keep_mode(l) : Keep::kAll;
    layer_forward(l, *a, out.data(), B, T, km == Keep::kAll ? mem : &work_mem_);
    if (c.is_moe_layer(l)) {
      loss.aux += a->moe.aux_loss;
      const auto& n = a->moe.layout.num_tokens_per_expert_E;
      mb.loads.emplace_back(n.data(), n.data() + n.size());
      mb.dropped += a->moe.layout.num_dropped;
    }
    x = std::move(out);
    if (keep) {
      drop_activations(*a, km);
      if (km != Keep::kAll)
        for (Buffer<float>* b : {&a->ln1, &a->rstd1, &a->q, &a->k, &a->v, &a->att, &a->attn_out,
                                 &a->h, &a->ln2, &a->rstd2, &a->mlp_g, &a->mlp_u, &a->mlp_h})
          b->set_tracker(mem);
      mb.layers.push_back(std::move(a));
    }
  }
  if (st.head) {
    mb.final_in = std::move(x);
    mb.final_ln.resize(NH, mem, dev_);
    mb.final_rstd.resize(N, mem, dev_);
    k::rmsnorm_forward(mb.final_ln.data(), mb.final_rstd.data(), mb.final_in.data(), w_.norm, N, H,
                       c.rms_norm_eps);
    mb.logits.resize(static_cast<size_t>(N) * V, mem, dev_);
    k::linear_forward(mb.logits.data(), mb.final_ln.data(), w_.lm_head, N, H, V);
    mb.probs.resize(static_cast<size_t>(N) * V, mem, dev_);
    mb.losses.resize(N, mem, dev_);
    loss.ce = k::cross_entropy_forward(mb.losses.data(), mb.probs.data(), mb.logits.data(),
                                       mb.targets.data(), N, V);
  } else {
    kernels::copy(x_out, x.data(), NH);
  }
  loss.total = loss.ce + loss.aux;
  mb.loss = loss;
  mb.have = keep;
  return loss;
}

void Model::backward(MicroBatch& mb, const float* dy_out, float* dx_in, float loss_scale) {
  MOE_CHECK(mb.have, "backward() called without a preceding forward() that kept activations");
  const ModelConfig& c = config_;
  const StageSpec& st = layout_.stage();
  MOE_CHECK(st.head || dy_out, "backward: a stage without the head needs the gradient dy_out");
  MOE_CHECK(st.embedding || dx_in, "backward: a stage without the embedding needs dx_in");
  const int B = mb.B, T = mb.T, N = B * T, H = c.hidden_size, V = c.vocab_size;
  const size_t NH = static_cast<size_t>(N) * H;
  MemTracker* work = &work_mem_;

  Buffer<float> dx(NH, work, dev_);  // gradient of the residual stream
  if (st.head) {
    // Loss -> logits -> final norm.
    Buffer<float> dlogits(static_cast<size_t>(N) * V, work, dev_);
    k::cross_entropy_backward(dlogits.data(), mb.probs.data(), mb.targets.data(), N, V,
                              loss_scale / N);
    Buffer<float> dln(NH, work, dev_);
    k::linear_backward(dln.data(), g_.lm_head, dlogits.data(), mb.final_ln.data(), w_.lm_head, N, H, V);
    k::rmsnorm_backward(dx.data(), g_.norm, dln.data(), mb.final_in.data(), w_.norm,
                        mb.final_rstd.data(), N, H);
    for (Buffer<float>* b :
         {&mb.final_in, &mb.final_ln, &mb.final_rstd, &mb.logits, &mb.probs, &mb.losses})
      b->release();
  } else {
    kernels::copy(dx.data(), dy_out, NH);
  }
  for (int i = static_cast<int>(mb.layers.size()) - 1; i >= 0; --i) {
    layer_backward(st.first_layer + i, *mb.layers[i], dx.data(), B, T, loss_scale);
    mb.layers[i].reset();  // this layer's activations are no longer needed
  }
  if (st.embedding) {
    k::embedding_backward(g_.embed, dx.data(), mb.inputs.data(), N, H);
  } else {
    kernels::copy(dx_in, dx.data(), NH);
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

std::vector<std::vector<int>> Model::expert_loads() const {
  return whole_ ? whole_->loads : std::vector<std::vector<int>>{};
}

int Model::dropped_pairs() const { return whole_ ? whole_->dropped : 0; }

}  // namespace moe::model
