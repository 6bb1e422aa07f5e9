#include "model/decoder.h"

#include <cmath>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/router_ops.h"
#include "kernels/swiglu_mlp.h"
#include "model/family.h"
#include "model/mla_block.h"

namespace moe::model {

namespace k = moe::kernels;
namespace mx = moe::mixture;

namespace {

// The rotation of position p alone: a one-row table holding row p of `t` (rope_forward rotates
// token t of a sequence by row t).
k::RopeTable rope_row(const k::RopeTable& t, int p) {
  k::RopeTable r;
  r.max_pos = 1;
  r.half = t.half;
  r.cos.assign(t.cos.begin() + static_cast<size_t>(p) * t.half,
               t.cos.begin() + static_cast<size_t>(p + 1) * t.half);
  r.sin.assign(t.sin.begin() + static_cast<size_t>(p) * t.half,
               t.sin.begin() + static_cast<size_t>(p + 1) * t.half);
  return r;
}

}  // namespace

Decoder::Decoder(const Model& model, int max_len)
    : model_(model), c_(model.config()), max_len_(max_len), dev_(model.device()) {
  const StageSpec& st = model.stage();
  MOE_CHECK(st.embedding && st.head && st.first_layer == 0 && st.end_layer(c_) == c_.num_hidden_layers,
            "decoding needs a model holding every layer, the embedding and the head");
  MOE_CHECK(model.layout().tp().size == 1, "decoding needs every tensor whole on this process (no tensor "
                                           "parallelism)");
  MOE_CHECK(model.layout().shard().holds_all(c_.n_routed_experts),
            "decoding needs every routed expert on this process (no expert parallelism)");
  MOE_CHECK(max_len >= 1 && max_len <= c_.max_position_embeddings, "decoding length ", max_len,
            " must be in [1, max_position_embeddings = ", c_.max_position_embeddings, "]");
  MOE_CHECK(attention_window(c_) == 0 || max_len <= attention_window(c_), "decoding length ", max_len,
            " exceeds sliding_window ", attention_window(c_), ": windowed attention is not supported");
  if (c_.uses_mla()) {
    rope_ = mla_rope_table(c_);
    latent_cache_.resize(c_.num_hidden_layers);
    rope_key_cache_.resize(c_.num_hidden_layers);
    for (int l = 0; l < c_.num_hidden_layers; ++l) {
      latent_cache_[l].resize(static_cast<size_t>(max_len) * c_.kv_lora_rank, &mem_, dev_);
      rope_key_cache_[l].resize(static_cast<size_t>(max_len) * c_.qk_rope_head_dim, &mem_, dev_);
    }
  } else {
    rope_ = k::make_rope_table(c_.max_position_embeddings, c_.head_dim(), c_.rope_theta);
    // The cache holds the key/value heads only (grouped-query attention: nkv of them).
    const size_t SH = static_cast<size_t>(max_len) * c_.kv_heads() * c_.head_dim();
    k_cache_.resize(c_.num_hidden_layers);
    v_cache_.resize(c_.num_hidden_layers);
    for (int l = 0; l < c_.num_hidden_layers; ++l) {
      k_cache_[l].resize(SH, &mem_, dev_);
      v_cache_[l].resize(SH, &mem_, dev_);
    }
  }
  scores_.resize(static_cast<size_t>(c_.num_attention_heads) * max_len, &mem_, dev_);
  top1_idx_.resize(c_.num_attention_heads, &mem_, dev_);
  top1_w_.resize(c_.num_attention_heads, &mem_, dev_);
  logits_dev_.resize(c_.vocab_size, &mem_, dev_);
  logits_.resize(c_.vocab_size);
}

const std::vector<float>& Decoder::feed(const int32_t* tokens, int n) {
  const k::ContextScope on(model_.context());  // the model's device, precision and workspaces
  const int H = c_.hidden_size, V = c_.vocab_size;
  MOE_CHECK(n >= 1, "decoding: feed needs at least one token, got ", n);
  MOE_CHECK(n == 1 || pos_ == 0, "decoding: only the first call may feed several tokens (the "
                                 "prompt); position ",
            pos_, ", ", n, " tokens");
  MOE_CHECK(static_cast<long long>(pos_) + n <= max_len_, "decoding: position ", pos_ + n,
            " is beyond the cache of ", max_len_, " positions (max_position_embeddings ",
            c_.max_position_embeddings, ")");
  for (int i = 0; i < n; ++i)
    MOE_CHECK(tokens[i] >= 0 && tokens[i] < V, "token id ", tokens[i],
              " is outside the vocabulary [0, ", V, ")");
  const size_t NH = static_cast<size_t>(n) * H;
  const size_t NA = static_cast<size_t>(n) * c_.num_attention_heads * c_.head_dim();
  k::ensure_buffer(tokens_, n, &mem_);
  for (Buffer<float>* b : {&x_, &ln_, &h_, &out_}) k::ensure_buffer(*b, NH, &mem_);
  k::ensure_buffer(q_, NA, &mem_);
  // The attention's output is [n, nh·v_head_dim] (nh·head_dim without MLA).
  k::ensure_buffer(attn_, static_cast<size_t>(n) * c_.num_attention_heads * c_.value_head_dim(), &mem_);
  k::ensure_buffer(rstd_, n, &mem_);
  device_copy(dev_, tokens_.data(), Device::kCpu, tokens, n * sizeof(int32_t));

  // The rotation of this step's position, shared by every layer. Assigned anew each step: the
  // CUDA rotation uploads a table on its first use, and the new table has no device copy yet.
  if (pos_ > 0) step_rope_ = rope_row(rope_, pos_);
  k::embedding_forward(x_.data(), tokens_.data(), model_.weights().embed, n, H);
  for (int l = 0; l < c_.num_hidden_layers; ++l) layer(l, n);
  // Final norm and head on the last token only.
  const float* x_last = x_.data() + static_cast<size_t>(n - 1) * H;
  k::rmsnorm_forward(ln_.data(), rstd_.data(), x_last, model_.weights().norm, 1, H, c_.rms_norm_eps);
  k::linear_forward(logits_dev_.data(), ln_.data(), model_.weights().lm_head, 1, H, V);
  // Host sync: the sampler reads the logits.
  device_copy(Device::kCpu, logits_.data(), dev_, logits_dev_.data(), V * sizeof(float));
  pos_ += n;
  return logits_;
}

void Decoder::layer(int l, int n) {
  const LayerTensors& W = model_.weights().layers[l];
  const int H = c_.hidden_size, nh = c_.num_attention_heads, hd = c_.head_dim();
  const int Akv = c_.kv_heads() * hd;
  const size_t NH = static_cast<size_t>(n) * H;
  // Attention block: h = x + o_proj(attn(rope(q, k), v)(rmsnorm(x))); k and v of the new tokens
  // (their nkv heads, model/attention_proj.h) are written straight into the cache rows
  // [pos_, pos_ + n); MLA caches its latent instead (mla_attention).
  k::rmsnorm_forward(ln_.data(), rstd_.data(), x_.data(), W.input_norm, n, H, c_.rms_norm_eps);
  if (c_.uses_mla()) {
    mla_attention(l, n);
  } else {
    float* kc = k_cache_[l].data() + static_cast<size_t>(pos_) * Akv;
    float* vc = v_cache_[l].data() + static_cast<size_t>(pos_) * Akv;
    // positions [0, n): the table as the full forward uses it; later, one token at position pos_
    const QkvDims d{1, pos_ == 0 ? n : 1, H, nh, c_.kv_heads(), hd};
    qkv_forward(q_.data(), kc, vc, nullptr, ln_.data(),
                {W.q, W.k, W.v, W.q_bias, W.k_bias, W.v_bias, W.q_norm, W.k_norm}, d,
                pos_ == 0 ? rope_ : step_rope_, c_.rms_norm_eps, qkv_scratch_, &mem_, &mem_);
    attention(l, n);
  }
  k::copy(h_.data(), x_.data(), NH);
  k::linear_forward(h_.data(), attn_.data(), W.o, n, nh * c_.value_head_dim(), H, /*accumulate=*/true);
  // FFN block: out = h + ffn(rmsnorm(h)).
  k::rmsnorm_forward(ln_.data(), rstd_.data(), h_.data(), W.post_norm, n, H, c_.rms_norm_eps);
  if (c_.is_moe_layer(l)) {
    k::fill_zero(out_.data(), NH);
    // Inference: every expert local, dropless (a capacity limit is a training-time device).
    mx::moe_forward(out_.data(), moe_, ln_.data(), moe_weights(W),
                    moe_config(c_, MoeOptions{}, nullptr, nullptr, &mem_, model_.score_bias_data(l)), n,
                    /*num_seqs=*/1, &mem_);
    k::add_inplace(out_.data(), h_.data(), NH);
  } else {
    const int I = c_.intermediate_size;
    const size_t NI = static_cast<size_t>(n) * I;
    for (Buffer<float>* b : {&mlp_g_, &mlp_u_, &mlp_h_}) k::ensure_buffer(*b, NI, &mem_);
    k::copy(out_.data(), h_.data(), NH);
    k::swiglu_mlp_forward(out_.data(), mlp_g_.data(), mlp_u_.data(), mlp_h_.data(), ln_.data(),
                          {W.mlp_gate, W.mlp_up, W.mlp_down}, n, H, I, /*accumulate=*/true);
  }
  std::swap(x_, out_);
}

size_t Decoder::cache_bytes() const {
  size_t b = 0;
  for (const auto* v : {&k_cache_, &v_cache_, &latent_cache_, &rope_key_cache_})
    for (const Buffer<float>& x : *v) b += x.bytes();
  return b;
}

void Decoder::mla_attention(int l, int n) {
  const LayerTensors& W = model_.weights().layers[l];
  const int H = c_.hidden_size, nh = c_.num_attention_heads, rq = c_.q_lora_rank, rkv = c_.kv_lora_rank;
  const k::MlaShape s = mla_shape(c_, nh, 1, n);
  const int dq = s.dn + s.dr, dkv = s.dn + s.dv, D = s.D;
  float* latent = latent_cache_[l].data() + static_cast<size_t>(pos_) * rkv;
  float* rope_key = rope_key_cache_[l].data() + static_cast<size_t>(pos_) * s.dr;
  const k::RopeTable& table = pos_ == 0 ? rope_ : step_rope_;
  // The new tokens' rotary keys into the cache: the head assembly of one head with no nope and a
  // one-column value rotates them in HF's order (K = rot(kpe), exactly D = dr columns).
  k::MlaShape key = s;
  key.nh = 1, key.dn = 0, key.dv = 1, key.D = s.dr;
  // mla_tmp_: kpe [n, dr] | the key assembly's unused Q and V [n, dr] each | the step's latent
  // [rkv], its rstd [1] and its raw query latent [rq].
  const size_t nr = static_cast<size_t>(n) * s.dr;
  k::ensure_buffer(mla_tmp_, 3 * nr + rkv + 1 + rq, &mem_);
  k::ensure_buffer(mla_kv_, static_cast<size_t>(n) * nh * dkv, &mem_);  // zeros: K and V unused
  float* kpe = mla_tmp_.data();
  float* scratch = kpe + nr;
  k::linear_forward(kpe, ln_.data(), W.kv_a + static_cast<size_t>(rkv) * H, n, H, s.dr);
  k::mla_heads_forward(scratch, rope_key, scratch + nr, kpe, mla_kv_.data(), kpe, table, key, 1.0f);
  if (pos_ == 0) {
    // The prompt: the training forward (positions [0, n)); its normed latents go to the cache.
    MlaActs a;
    mla_forward(a, attn_.data(), ln_.data(), W, c_, nh, 1, n, rope_, &mem_, &mem_, dev_);
    k::copy(latent, a.ckv_normed.data(), static_cast<size_t>(n) * rkv);
    return;
  }
  // One token at position pos_: its latent, its query's heads (Q = scale·[q_nope | rot(q_pe) | 0]).
  float* ckv = scratch + 2 * nr;
  float* rstd = ckv + rkv;
  k::linear_forward(ckv, ln_.data(), W.kv_a, 1, H, rkv);
  k::rmsnorm_forward(latent, rstd, ckv, W.kv_a_norm, 1, rkv, 1e-6f);
  k::ensure_buffer(mla_q_, static_cast<size_t>(nh) * dq + std::max(rq, 1), &mem_);
  float* q = mla_q_.data();
  if (rq > 0) {
    float* qa = q + static_cast<size_t>(nh) * dq;
    float* qa_raw = rstd + 1;
    k::linear_forward(qa_raw, ln_.data(), W.q_a, 1, H, rq);
    k::rmsnorm_forward(qa, rstd, qa_raw, W.q_a_norm, 1, rq, 1e-6f);
    k::linear_forward(q, qa, W.q_b, 1, rq, nh * dq);
  } else {
    k::linear_forward(q, ln_.data(), W.q, 1, H, nh * dq);
  }
  k::ensure_buffer(mla_heads_, 3 * static_cast<size_t>(nh) * D, &mem_);
  float* Q = mla_heads_.data();
  k::mla_heads_forward(Q, Q + static_cast<size_t>(nh) * D, Q + 2 * static_cast<size_t>(nh) * D, q,
                       mla_kv_.data(), kpe, table, s, mla_q_scale(c_, s));
  // Per head h over the cache rows [0, p]: the key's and value's kv_b rows absorbed,
  //   scores = (q_nope_h · W_UK_h) · latent^T + q_rope_h · rope_key^T, over sqrt(D) (Q is scaled)
  //   out_h  = (softmax(scores) · latent) · W_UV_h^T
  const int S = pos_ + 1;
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  k::ensure_buffer(mla_ctx_, 2 * static_cast<size_t>(rkv), &mem_);
  float *qa = mla_ctx_.data(), *ctx = qa + rkv;
  const float* lat = latent_cache_[l].data();
  const float* rk = rope_key_cache_[l].data();
  for (int h = 0; h < nh; ++h) {
    const float* Qh = Q + static_cast<size_t>(h) * D;
    const float* w_uk = W.kv_b + static_cast<size_t>(h) * dkv * rkv;  // [dn, rkv]
    float* sc = scores_.data() + static_cast<size_t>(h) * S;
    if (s.dn > 0) {
      k::gemm(false, false, 1, rkv, s.dn, 1.0f, Qh, D, w_uk, rkv, 0.0f, qa, rkv);
      k::gemm(false, true, 1, S, rkv, inv, qa, rkv, lat, rkv, 0.0f, sc, S);
      k::gemm(false, true, 1, S, s.dr, inv, Qh + s.dn, D, rk, s.dr, 1.0f, sc, S);
    } else {
      k::gemm(false, true, 1, S, s.dr, inv, Qh, D, rk, s.dr, 0.0f, sc, S);
    }
  }
  k::router_topk(scores_.data(), top1_idx_.data(), top1_w_.data(), nh, S, 1, /*renorm=*/false);
  for (int h = 0; h < nh; ++h) {
    const float* w_uv = W.kv_b + (static_cast<size_t>(h) * dkv + s.dn) * rkv;
    k::gemm(false, false, 1, rkv, S, 1.0f, scores_.data() + static_cast<size_t>(h) * S, S, lat, rkv, 0.0f, ctx, rkv);
    k::gemm(false, true, 1, s.dv, rkv, 1.0f, ctx, rkv, w_uv, rkv, 0.0f, attn_.data() + static_cast<size_t>(h) * s.dv,
            nh * s.dv);
  }
}

void Decoder::attention(int l, int n) {
  const int nh = c_.num_attention_heads, nkv = c_.kv_heads(), hd = c_.head_dim();
  const int A = nh * hd, Akv = nkv * hd, rep = nh / nkv;
  const float* kc = k_cache_[l].data();
  const float* vc = v_cache_[l].data();
  if (pos_ == 0) {
    // The prompt: the cache rows [0, n) are the [1, n, Akv] keys and values of the full forward,
    // repeated to the nh query heads for the attention kernel under GQA (as the model does).
    k::ensure_buffer(att_, k::attention_saved_floats(1, n, nh, hd), &mem_);
    if (rep > 1) {
      const QkvDims d{1, n, c_.hidden_size, nh, nkv, hd};
      for (Buffer<float>* b : {&k_rep_, &v_rep_}) k::ensure_buffer(*b, static_cast<size_t>(n) * A, &mem_);
      repeat_kv(k_rep_.data(), kc, d, qkv_scratch_);
      repeat_kv(v_rep_.data(), vc, d, qkv_scratch_);
      kc = k_rep_.data();
      vc = v_rep_.data();
    }
    k::attention_forward(attn_.data(), att_.data(), q_.data(), kc, vc, 1, n, nh, hd);
    return;
  }
  // One query at position p over the cache rows [0, p], per head h (column block h·hd of a row;
  // its key/value head g = h / rep, column block g·hd of a cache row):
  //   scores_h = scale · q_h · K_g^T [1, p+1];  probs_h = softmax(scores_h);  out_h = probs_h · V_g
  // No mask: every cached position precedes the query. The row softmax is router_topk's (k = 1,
  // its top-1 output unused): the same softmax_row of element_math.h that the attention kernel's
  // rows use, and a kernel with a CUDA twin, so this loop runs on either device.
  const int S = pos_ + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int h = 0; h < nh; ++h)
    k::gemm(false, true, 1, S, hd, scale, q_.data() + h * hd, A, kc + (h / rep) * hd, Akv, 0.0f,
            scores_.data() + static_cast<size_t>(h) * S, S);
  k::router_topk(scores_.data(), top1_idx_.data(), top1_w_.data(), nh, S, 1, /*renorm=*/false);
  for (int h = 0; h < nh; ++h)
    k::gemm(false, false, 1, hd, S, 1.0f, scores_.data() + static_cast<size_t>(h) * S, S,
            vc + (h / rep) * hd, Akv, 0.0f, attn_.data() + h * hd, A);
}

}  // namespace moe::model
