// Multi-head latent attention's forward and backward. See mla_block.h.
#include "model/mla_block.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"

namespace moe::model {

namespace k = moe::kernels;

namespace {
constexpr float kLatentEps = 1e-6f;  // DeepseekV2/V3RMSNorm's default, used for both latents
}  // namespace

k::RopeTable mla_rope_table(const ModelConfig& c) {
  if (c.rope_scaling.type != "yarn")
    return k::make_rope_table(c.max_position_embeddings, c.qk_rope_head_dim, c.rope_theta);
  const ModelConfig::RopeScaling& r = c.rope_scaling;
  k::YarnParams y;
  y.factor = r.factor;
  y.mscale = r.mscale;
  y.mscale_all_dim = r.mscale_all_dim;
  y.beta_fast = r.beta_fast;
  y.beta_slow = r.beta_slow;
  y.original_max_pos = r.original_max_position_embeddings;
  return k::make_yarn_rope_table(c.max_position_embeddings, c.qk_rope_head_dim, c.rope_theta, y);
}

k::MlaShape mla_shape(const ModelConfig& c, int nh, int B, int T) {
  k::MlaShape s;
  s.B = B;
  s.T = T;
  s.nh = nh;
  s.dn = c.qk_nope_head_dim;
  s.dr = c.qk_rope_head_dim;
  s.dv = c.v_head_dim;
  s.D = std::max(s.dn + s.dr, s.dv);
  return s;
}

float mla_q_scale(const ModelConfig& c, const k::MlaShape& s) {
  return static_cast<float>(c.softmax_scale() * std::sqrt(static_cast<double>(s.D)));
}

void mla_forward(MlaActs& a, float* attn_out, const float* x, const LayerTensors& W,
                 const ModelConfig& c, int nh, int B, int T, const k::RopeTable& rope,
                 MemTracker* mem, MemTracker* work, Device dev) {
  const int N = B * T, H = c.hidden_size, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
  const k::MlaShape s = mla_shape(c, nh, B, T);
  const int dq = s.dn + s.dr, D = s.D;
  const size_t rows = static_cast<size_t>(N);
  // The query [N, nh·dq].
  Buffer<float> q;
  q.resize_for_overwrite(rows * nh * dq, work, dev);
  if (rq > 0) {
    a.qa.resize_for_overwrite(rows * rq, mem, dev);
    a.qa_normed.resize_for_overwrite(rows * rq, mem, dev);
    a.rstd_q.resize_for_overwrite(rows, mem, dev);
    k::linear_forward(a.qa.data(), x, W.q_a, N, H, rq);
    k::rmsnorm_forward(a.qa_normed.data(), a.rstd_q.data(), a.qa.data(), W.q_a_norm, N, rq, kLatentEps);
    k::linear_forward(q.data(), a.qa_normed.data(), W.q_b, N, rq, nh * dq);
  } else {
    k::linear_forward(q.data(), x, W.q, N, H, nh * dq);
  }
  // The latent and the rotary key: kv_a's first rkv rows, then its dr rows (two products, so
  // neither output needs a strided copy).
  Buffer<float> kpe, kv;
  a.ckv.resize_for_overwrite(rows * rkv, mem, dev);
  a.ckv_normed.resize_for_overwrite(rows * rkv, mem, dev);
  a.rstd_kv.resize_for_overwrite(rows, mem, dev);
  kpe.resize_for_overwrite(rows * s.dr, work, dev);
  k::linear_forward(a.ckv.data(), x, W.kv_a, N, H, rkv);
  k::linear_forward(kpe.data(), x, W.kv_a + static_cast<size_t>(rkv) * H, N, H, s.dr);
  k::rmsnorm_forward(a.ckv_normed.data(), a.rstd_kv.data(), a.ckv.data(), W.kv_a_norm, N, rkv, kLatentEps);
  kv.resize_for_overwrite(rows * nh * (s.dn + s.dv), work, dev);
  k::linear_forward(kv.data(), a.ckv_normed.data(), W.kv_b, N, rkv, nh * (s.dn + s.dv));
  // The heads, and attention over them.
  const size_t heads = rows * nh * D;
  for (Buffer<float>* b : {&a.Q, &a.K, &a.V}) b->resize_for_overwrite(heads, mem, dev);
  k::mla_heads_forward(a.Q.data(), a.K.data(), a.V.data(), q.data(), kv.data(), kpe.data(), rope, s,
                       mla_q_scale(c, s));
  a.att.resize_for_overwrite(k::attention_saved_floats(B, T, nh, D), mem, dev);
  if (D == s.dv) {
    k::attention_forward(attn_out, a.att.data(), a.Q.data(), a.K.data(), a.V.data(), B, T, nh, D);
  } else {
    Buffer<float> out;
    out.resize_for_overwrite(heads, work, dev);
    k::attention_forward(out.data(), a.att.data(), a.Q.data(), a.K.data(), a.V.data(), B, T, nh, D);
    k::copy_cols(attn_out, s.dv, out.data(), D, rows * nh);
  }
}

void mla_backward(float* dx, const LayerTensors& G, const float* dattn_out, const MlaActs& a,
                  const float* x, const LayerTensors& W, const ModelConfig& c, int nh, int B, int T,
                  const k::RopeTable& rope, MemTracker* work, Device dev) {
  const int N = B * T, H = c.hidden_size, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
  const k::MlaShape s = mla_shape(c, nh, B, T);
  const int dq = s.dn + s.dr, D = s.D;
  const size_t rows = static_cast<size_t>(N), heads = rows * nh * D;
  // Attention: d(out) padded to D columns (the padding's gradient is zero), then dQ, dK, dV.
  Buffer<float> dout_pad(D == s.dv ? 0 : heads, work, dev);
  const float* dout = dattn_out;
  if (D != s.dv) {
    k::copy_cols(dout_pad.data(), D, dattn_out, s.dv, rows * nh);
    dout = dout_pad.data();
  }
  Buffer<float> dQ(heads, work, dev), dK(heads, work, dev), dV(heads, work, dev);
  Buffer<float> att_scratch(k::attention_scratch_floats(T), work, dev);
  k::attention_backward(dQ.data(), dK.data(), dV.data(), dout, a.Q.data(), a.K.data(), a.V.data(),
                        a.att.data(), B, T, nh, D, att_scratch.data());
  Buffer<float> dq_(rows * nh * dq, work, dev), dkv(rows * nh * (s.dn + s.dv), work, dev),
      dkpe(rows * s.dr, work, dev);
  k::mla_heads_backward(dq_.data(), dkv.data(), dkpe.data(), dQ.data(), dK.data(), dV.data(), rope, s,
                        mla_q_scale(c, s));
  // The latent: kv_b, its norm, kv_a's two row blocks.
  Buffer<float> dckv_n(rows * rkv, work, dev), dckv(rows * rkv, work, dev);
  k::linear_backward(dckv_n.data(), G.kv_b, dkv.data(), a.ckv_normed.data(), W.kv_b, N, rkv, nh * (s.dn + s.dv));
  k::rmsnorm_backward(dckv.data(), G.kv_a_norm, dckv_n.data(), a.ckv.data(), W.kv_a_norm, a.rstd_kv.data(),
                      N, rkv);
  k::linear_backward(dx, G.kv_a, dckv.data(), x, W.kv_a, N, H, rkv);
  const size_t pe_rows = static_cast<size_t>(rkv) * H;
  k::linear_backward(dx, G.kv_a + pe_rows, dkpe.data(), x, W.kv_a + pe_rows, N, H, s.dr);
  // The query.
  if (rq > 0) {
    Buffer<float> dqa_n(rows * rq, work, dev), dqa(rows * rq, work, dev);
    k::linear_backward(dqa_n.data(), G.q_b, dq_.data(), a.qa_normed.data(), W.q_b, N, rq, nh * dq);
    k::rmsnorm_backward(dqa.data(), G.q_a_norm, dqa_n.data(), a.qa.data(), W.q_a_norm, a.rstd_q.data(), N, rq);
    k::linear_backward(dx, G.q_a, dqa.data(), x, W.q_a, N, H, rq);
  } else {
    k::linear_backward(dx, G.q, dq_.data(), x, W.q, N, H, nh * dq);
  }
}

}  // namespace moe::model
