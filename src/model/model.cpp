#include "model/model.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu_mlp.h"

namespace moe::model {

namespace k = moe::kernels;
namespace mx = moe::mixture;

// Activations of one layer kept for backward. Shapes use N = B·T tokens.
struct Model::LayerActs {
  Buffer<float> x;          // [N,H] layer input (residual stream)
  Buffer<float> ln1;        // [N,H] rmsnorm(x)
  Buffer<float> rstd1;      // [N]
  Buffer<float> q, k, v;    // [N,H] after rope (q, k)
  Buffer<float> att;        // [B,nh,T,T] attention probabilities
  Buffer<float> attn_out;   // [N,H] heads concatenated, before o_proj
  Buffer<float> h;          // [N,H] x + attention
  Buffer<float> ln2;        // [N,H] rmsnorm(h)
  Buffer<float> rstd2;      // [N]
  Buffer<float> mlp_g, mlp_u, mlp_h;  // [N,I] dense SwiGLU
  mx::MoeActivations moe;   // MoE layer
};

namespace {

mx::MoeConfig moe_config(const ModelConfig& c, const MoeOptions& o, const mx::ExpertParallel* ep) {
  mx::MoeConfig m;
  m.hidden = c.hidden_size;
  m.ffn = c.moe_intermediate_size;
  m.num_experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  m.shared_ffn = c.moe_intermediate_size * c.n_shared_experts;
  m.norm_topk_prob = c.norm_topk_prob;
  m.aux_loss_alpha = c.aux_loss_alpha;
  m.seq_aux = c.seq_aux;
  m.capacity_factor = o.capacity_factor;
  m.padded = o.padded;
  m.ep = ep;
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
ExpertShard shard_of(const ModelConfig& c, const mx::ExpertParallel* ep) {
  if (!ep) return {};
  MOE_CHECK(ep->size >= 1 && c.n_routed_experts % ep->size == 0, "expert parallelism over ",
            ep->size, " ranks does not divide n_routed_experts (", c.n_routed_experts, ")");
  return {ep->expert_begin(c.n_routed_experts), ep->num_local_experts(c.n_routed_experts)};
}
}  // namespace

Model::Model(const ModelConfig& config, MoeOptions moe_options, const mx::ExpertParallel* ep)
    : config_(config), moe_options_(moe_options), ep_(ep), layout_(config, shard_of(config, ep)) {
  config_.validate();
  params_.resize(layout_.total());
  grads_.resize(layout_.total());
  w_ = bind_tensors(layout_, config_, params_.data());
  g_ = bind_tensors(layout_, config_, grads_.data());
  rope_ = k::make_rope_table(config_.max_position_embeddings, config_.head_dim(), config_.rope_theta);
}

Model::~Model() = default;

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
  const float std = config_.initializer_range;
  for (const ParamSpec& s : layout_.specs()) {
    float* p = params_.data() + s.offset;
    if (s.shape.size() == 1) {
      for (size_t i = 0; i < s.numel; ++i) p[i] = 1.0f;  // norm weights
    } else {
      Rng rng = derive_rng(seed, fnv1a(s.name));
      for (size_t i = 0; i < s.numel; ++i) p[i] = static_cast<float>(std * rng.normal());
    }
  }
}

double Model::flops_per_token(int T) const {
  ParamCounts pc = count_params(config_);
  double n_active = static_cast<double>(pc.active) -
                    static_cast<double>(config_.vocab_size) * config_.hidden_size;  // lookup only
  return 6.0 * n_active + 12.0 * config_.num_hidden_layers * config_.hidden_size * T;
}

LossParts Model::forward(const int32_t* tokens_BT1, int B, int T) {
  forward_impl(tokens_BT1, B, T, /*keep=*/true);
  return loss_;
}

LossParts Model::evaluate(const int32_t* tokens_BT1, int B, int T) {
  forward_impl(tokens_BT1, B, T, /*keep=*/false);
  return loss_;
}

void Model::forward_impl(const int32_t* tokens_BT1, int B, int T, bool keep) {
  const ModelConfig& c = config_;
  MOE_CHECK(B > 0 && T > 0, "forward: batch (", B, ") and sequence length (", T, ") must be positive");
  MOE_CHECK(T <= c.max_position_embeddings, "sequence length ", T, " exceeds max_position_embeddings ",
            c.max_position_embeddings);
  const int N = B * T, H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads;
  const int hd = c.head_dim(), I = c.intermediate_size;
  B_ = B;
  T_ = T;
  tokens_.resize(static_cast<size_t>(B) * (T + 1));
  std::memcpy(tokens_.data(), tokens_BT1, tokens_.size() * sizeof(int32_t));
  std::vector<int32_t> inputs(N), targets(N);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      int32_t in = tokens_[b * (T + 1) + t], tg = tokens_[b * (T + 1) + t + 1];
      MOE_CHECK(in >= 0 && in < V && tg >= 0 && tg < V, "token id ", (in < 0 || in >= V) ? in : tg,
                " is outside the vocabulary [0, ", V, ")");
      inputs[b * T + t] = in;
      targets[b * T + t] = tg;
    }

  MemTracker* mem = &act_mem_;
  acts_.clear();
  have_acts_ = false;
  const mx::MoeConfig mcfg = moe_config(c, moe_options_, ep_);

  Buffer<float> x(static_cast<size_t>(N) * H, mem);
  k::embedding_forward(x.data(), inputs.data(), w_.embed, N, H);
  loss_ = LossParts{};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerTensors& W = w_.layers[l];
    auto a = std::make_unique<LayerActs>();
    a->x = std::move(x);
    a->ln1.resize(static_cast<size_t>(N) * H, mem);
    a->rstd1.resize(N, mem);
    k::rmsnorm_forward(a->ln1.data(), a->rstd1.data(), a->x.data(), W.input_norm, N, H, c.rms_norm_eps);
    a->q.resize(static_cast<size_t>(N) * H, mem);
    a->k.resize(static_cast<size_t>(N) * H, mem);
    a->v.resize(static_cast<size_t>(N) * H, mem);
    k::linear_forward(a->q.data(), a->ln1.data(), W.q, N, H, H);
    k::linear_forward(a->k.data(), a->ln1.data(), W.k, N, H, H);
    k::linear_forward(a->v.data(), a->ln1.data(), W.v, N, H, H);
    k::rope_forward(a->q.data(), rope_, B, T, nh, hd);
    k::rope_forward(a->k.data(), rope_, B, T, nh, hd);
    a->att.resize(static_cast<size_t>(B) * nh * T * T, mem);
    a->attn_out.resize(static_cast<size_t>(N) * H, mem);
    k::attention_forward(a->attn_out.data(), a->att.data(), a->q.data(), a->k.data(), a->v.data(), B,
                         T, nh, hd);
    a->h.resize(static_cast<size_t>(N) * H, mem);
    std::memcpy(a->h.data(), a->x.data(), a->h.bytes());
    k::linear_forward(a->h.data(), a->attn_out.data(), W.o, N, H, H, /*accumulate=*/true);

    a->ln2.resize(static_cast<size_t>(N) * H, mem);
    a->rstd2.resize(N, mem);
    k::rmsnorm_forward(a->ln2.data(), a->rstd2.data(), a->h.data(), W.post_norm, N, H, c.rms_norm_eps);
    Buffer<float> out(static_cast<size_t>(N) * H, mem);
    if (c.is_moe_layer(l)) {
      mx::moe_forward(out.data(), a->moe, a->ln2.data(), moe_weights(W), mcfg, N, B, mem);
      k::add_inplace(out.data(), a->h.data(), out.size());
      loss_.aux += a->moe.aux_loss;
    } else {
      std::memcpy(out.data(), a->h.data(), out.bytes());
      a->mlp_g.resize(static_cast<size_t>(N) * I, mem);
      a->mlp_u.resize(static_cast<size_t>(N) * I, mem);
      a->mlp_h.resize(static_cast<size_t>(N) * I, mem);
      k::swiglu_mlp_forward(out.data(), a->mlp_g.data(), a->mlp_u.data(), a->mlp_h.data(),
                            a->ln2.data(), {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I,
                            /*accumulate=*/true);
    }
    x = std::move(out);
    if (keep) {
      acts_.push_back(std::move(a));
    } else {
      // Evaluation keeps only what the expert-load statistics need.
      if (c.is_moe_layer(l)) {
        auto slim = std::make_unique<LayerActs>();
        slim->moe.layout = std::move(a->moe.layout);
        acts_.push_back(std::move(slim));
      } else {
        acts_.push_back(nullptr);
      }
    }
  }
  final_in_ = std::move(x);
  final_ln_.resize(static_cast<size_t>(N) * H, mem);
  final_rstd_.resize(N, mem);
  k::rmsnorm_forward(final_ln_.data(), final_rstd_.data(), final_in_.data(), w_.norm, N, H,
                     c.rms_norm_eps);
  logits_.resize(static_cast<size_t>(N) * V, mem);
  k::linear_forward(logits_.data(), final_ln_.data(), w_.lm_head, N, H, V);
  probs_.resize(static_cast<size_t>(N) * V, mem);
  losses_.resize(N, mem);
  loss_.ce = k::cross_entropy_forward(losses_.data(), probs_.data(), logits_.data(), targets.data(), N, V);
  loss_.total = loss_.ce + loss_.aux;
  have_acts_ = keep;
}

void Model::backward(float loss_scale) {
  MOE_CHECK(have_acts_, "backward() called without a preceding forward()");
  const ModelConfig& c = config_;
  const int B = B_, T = T_, N = B * T, H = c.hidden_size, V = c.vocab_size;
  const int nh = c.num_attention_heads, hd = c.head_dim(), I = c.intermediate_size;
  std::vector<int32_t> inputs(N), targets(N);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      inputs[b * T + t] = tokens_[b * (T + 1) + t];
      targets[b * T + t] = tokens_[b * (T + 1) + t + 1];
    }
  const mx::MoeConfig mcfg = moe_config(c, moe_options_, ep_);
  MemTracker* mem = &act_mem_;

  // Loss -> logits -> final norm.
  Buffer<float> dlogits(static_cast<size_t>(N) * V, mem);
  k::cross_entropy_backward(dlogits.data(), probs_.data(), targets.data(), N, V, loss_scale / N);
  Buffer<float> dln(static_cast<size_t>(N) * H, mem);
  k::linear_backward(dln.data(), g_.lm_head, dlogits.data(), final_ln_.data(), w_.lm_head, N, H, V);
  dlogits.release();
  logits_.release();
  probs_.release();
  losses_.release();
  Buffer<float> dx(static_cast<size_t>(N) * H, mem);  // gradient of the residual stream
  k::rmsnorm_backward(dx.data(), g_.norm, dln.data(), final_in_.data(), w_.norm, final_rstd_.data(), N,
                      H);
  final_in_.release();
  final_ln_.release();
  final_rstd_.release();

  Buffer<float> dq(static_cast<size_t>(N) * H, mem), dk(static_cast<size_t>(N) * H, mem);
  Buffer<float> dv(static_cast<size_t>(N) * H, mem), dattn(static_cast<size_t>(N) * H, mem);
  Buffer<float> att_scratch(static_cast<size_t>(T) * T, mem);
  Buffer<float> mlp_scratch;
  for (int l = c.num_hidden_layers - 1; l >= 0; --l) {
    LayerActs& a = *acts_[l];
    const LayerTensors& W = w_.layers[l];
    const LayerTensors& G = g_.layers[l];
    // FFN branch: out = h + ffn(ln2(h)); dx holds d(out).
    dln.zero();
    if (c.is_moe_layer(l)) {
      mx::moe_backward(dln.data(), moe_grads(G), dx.data(), /*aux_grad=*/loss_scale, a.moe, a.ln2.data(),
                       moe_weights(W), mcfg, N, B);
    } else {
      if (mlp_scratch.size() < 2 * static_cast<size_t>(N) * I)
        mlp_scratch.resize(2 * static_cast<size_t>(N) * I, mem);
      k::swiglu_mlp_backward(dln.data(), {G.mlp_gate, G.mlp_up, G.mlp_down}, dx.data(), a.ln2.data(),
                             a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(),
                             {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, mlp_scratch.data());
    }
    k::rmsnorm_backward(dx.data(), G.post_norm, dln.data(), a.h.data(), W.post_norm, a.rstd2.data(), N,
                        H);
    // Attention branch: h = x + o_proj(attn); dx now holds d(h).
    dattn.zero();
    k::linear_backward(dattn.data(), G.o, dx.data(), a.attn_out.data(), W.o, N, H, H);
    dq.zero();
    dk.zero();
    dv.zero();
    k::attention_backward(dq.data(), dk.data(), dv.data(), dattn.data(), a.q.data(), a.k.data(),
                          a.v.data(), a.att.data(), B, T, nh, hd, att_scratch.data());
    k::rope_backward(dq.data(), rope_, B, T, nh, hd);
    k::rope_backward(dk.data(), rope_, B, T, nh, hd);
    dln.zero();
    k::linear_backward(dln.data(), G.q, dq.data(), a.ln1.data(), W.q, N, H, H);
    k::linear_backward(dln.data(), G.k, dk.data(), a.ln1.data(), W.k, N, H, H);
    k::linear_backward(dln.data(), G.v, dv.data(), a.ln1.data(), W.v, N, H, H);
    k::rmsnorm_backward(dx.data(), G.input_norm, dln.data(), a.x.data(), W.input_norm, a.rstd1.data(),
                        N, H);
    acts_[l].reset();  // this layer's activations are no longer needed
  }
  k::embedding_backward(g_.embed, dx.data(), inputs.data(), N, H);
  acts_.clear();
  have_acts_ = false;
}

const float* Model::logits() const { return logits_.data(); }

std::vector<std::vector<int>> Model::expert_loads() const {
  std::vector<std::vector<int>> loads;
  for (size_t l = 0; l < acts_.size(); ++l) {
    if (!config_.is_moe_layer(static_cast<int>(l)) || !acts_[l]) continue;
    const auto& n = acts_[l]->moe.layout.num_tokens_per_expert_E;
    loads.emplace_back(n.data(), n.data() + n.size());
  }
  return loads;
}

int Model::dropped_pairs() const {
  int d = 0;
  for (size_t l = 0; l < acts_.size(); ++l)
    if (acts_[l] && config_.is_moe_layer(static_cast<int>(l))) d += acts_[l]->moe.layout.num_dropped;
  return d;
}

}  // namespace moe::model
