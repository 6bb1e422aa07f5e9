// One decoder layer of Model, forward and backward (RMSNorm, attention or MLA, the dense FFN or
// the MoE block, under tensor parallelism), and what it keeps or drops for recompute.
#include "model/model.h"

#include <cmath>
#include <cstring>

#include "comm/group.h"
#include "core/error.h"
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
  Buffer<float> partial(static_cast<size_t>(N) * H, &work_mem_, device());
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
  const int nkv = c.kv_heads() / tp;                                        // this rank's key/value heads
  const int I = c.intermediate_size / tp;
  const size_t NH = static_cast<size_t>(N) * H, nH = static_cast<size_t>(n) * H;
  const size_t NA = static_cast<size_t>(N) * Ha, mine = nH * tp_rank();  // this shard's rows
  const bool moe = c.is_moe_layer(l);
  // The normed shard goes into its rows of the gathered [N,H] that q, k, v read.
  a.ln1.resize_for_overwrite(NH, mem, device());
  a.rstd1.resize_for_overwrite(n, mem, device());
  k::rmsnorm_forward(a.ln1.data() + mine, a.rstd1.data(), a.x.data(), W.input_norm, n, H, c.rms_norm_eps);
  tp_allgather(a.ln1.data(), nH);
  a.attn_out.resize_for_overwrite(NA, mem, device());
  if (c.uses_mla()) {
    const k::Bf16InputScope ln1_once(a.ln1.data(), NH);  // q (or q_a) and kv_a read the same rows
    mla_forward(a.mla, a.attn_out.data(), a.ln1.data(), W, c, nh, B, T, rope_, mem, &work_mem_, device());
  } else {
    a.q.resize_for_overwrite(NA, mem, device());
    a.k.resize_for_overwrite(NA, mem, device());
    a.v.resize_for_overwrite(NA, mem, device());
    {  // q, k, v (model/attention_proj.h); grouped-query attention: k, v of nkv heads, repeated
      const QkvDims d{B, T, H, nh, nkv, hd};
      Buffer<float> k_kv, v_kv;  // [N,Akv] (GQA only; MHA writes a.k, a.v directly)
      if (nkv != nh) {
        k_kv.resize_for_overwrite(static_cast<size_t>(N) * d.Akv(), &work_mem_, device());
        v_kv.resize_for_overwrite(static_cast<size_t>(N) * d.Akv(), &work_mem_, device());
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
    a.att.resize_for_overwrite(k::attention_saved_floats(B, T, nh, hd), mem, device());
    k::attention_forward(a.attn_out.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T,
                         nh, hd);
  }
  a.h.resize_for_overwrite(nH, mem, device());
  kernels::copy(a.h.data(), a.x.data(), a.h.size());
  row_parallel_add(a.h.data(), a.attn_out.data(), W.o, N, Ha, H);
  // MoE: the block runs on the shard (SSMB). Dense: the normed shard is gathered for gate/up.
  a.ln2.resize_for_overwrite(moe ? nH : NH, mem, device());
  a.rstd2.resize_for_overwrite(n, mem, device());
  k::rmsnorm_forward(a.ln2.data() + (moe ? 0 : mine), a.rstd2.data(), a.h.data(), W.post_norm, n, H,
                     c.rms_norm_eps);
  if (moe) {
    kernels::fill_zero(out, nH);
    mx::moe_forward(out, a.moe, a.ln2.data(), moe_weights(W),
                    layer_moe_config(l),
                    n, moe_sequences(B), mem);
    k::add_inplace(out, a.h.data(), nH);
  } else {
    tp_allgather(a.ln2.data(), nH);
    a.mlp_g.resize_for_overwrite(static_cast<size_t>(N) * I, mem, device());
    a.mlp_u.resize_for_overwrite(static_cast<size_t>(N) * I, mem, device());
    a.mlp_h.resize_for_overwrite(static_cast<size_t>(N) * I, mem, device());
    kernels::copy(out, a.h.data(), nH);
    if (!tp_) {
      k::swiglu_mlp_forward(out, a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(), a.ln2.data(),
                            {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, /*accumulate=*/true);
    } else {
      Buffer<float> partial(NH, &work_mem_, device());
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
    Buffer<float> out(nH, work, device());
    if (!a.ln2.data()) {
      layer_forward(l, a, out.data(), B, T, work);
    } else {
      MOE_CHECK(moe, "internal: layer ", l, " lost activations it cannot recompute");
      mx::moe_forward(out.data(), a.moe, a.ln2.data(), moe_weights(W),
                      layer_moe_config(l), n,
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
  Buffer<float> dy_full(tp_ ? NH : 0, work, device());
  auto gathered = [&](const float* shard) -> const float* {
    if (!tp_) return shard;
    kernels::copy(dy_full.data() + mine, shard, nH);
    tp_allgather(dy_full.data(), nH);
    return dy_full.data();
  };
  Buffer<float> dln(moe ? nH : NH, work, device());
  // FFN branch: out = h + ffn(ln2(h)); dx holds d(out).
  if (moe) {
    mx::MoeConfig cfg = layer_moe_config(l);
    cfg.workspace = &moe_work_;
    mx::moe_backward(dln.data(), moe_grads(G), dx, /*aux_grad=*/loss_scale, a.moe, a.ln2.data(),
                     moe_weights(W), cfg, n, moe_sequences(B));
  } else {
    Buffer<float> scratch(2 * static_cast<size_t>(N) * I, work, device());
    k::swiglu_mlp_backward(dln.data(), {G.mlp_gate, G.mlp_up, G.mlp_down}, gathered(dx), a.ln2.data(),
                           a.mlp_g.data(), a.mlp_u.data(), a.mlp_h.data(),
                           {W.mlp_gate, W.mlp_up, W.mlp_down}, N, H, I, scratch.data());
    tp_reduce_scatter(dln.data(), nH);
  }
  k::rmsnorm_backward(dx, G.post_norm, dln.data() + (moe ? 0 : mine), a.h.data(), W.post_norm,
                      a.rstd2.data(), n, H);
  // Attention branch: h = x + o_proj(attn); dx now holds d(h).
  Buffer<float> dattn(NA, work, device());
  k::linear_backward(dattn.data(), G.o, gathered(dx), a.attn_out.data(), W.o, N, Ha, H);
  if (dln.size() == NH)
    dln.zero();
  else
    dln.resize(NH, work, device());
  if (c.uses_mla()) {
    const k::Bf16InputScope ln1_once(a.ln1.data(), NH);
    mla_backward(dln.data(), G, dattn.data(), a.mla, a.ln1.data(), W, c, nh, B, T, rope_, work, device());
  } else {
    Buffer<float> dq(NA, work, device()), dk(NA, work, device()), dv(NA, work, device());
    Buffer<float> att_scratch(k::attention_scratch_floats(T), work, device());
    k::attention_backward(dq.data(), dk.data(), dv.data(), dattn.data(), a.q.data(), a.k.data(),
                          a.v.data(), a.att.data(), B, T, nh, hd, att_scratch.data());
    // back through the projections; grouped-query attention: dk, dv summed over each group first
    const QkvDims d{B, T, H, nh, nkv, hd};
    Buffer<float> dk_kv, dv_kv;
    if (nkv != nh) {
      dk_kv.resize(static_cast<size_t>(N) * d.Akv(), work, device());
      dv_kv.resize(static_cast<size_t>(N) * d.Akv(), work, device());
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

}  // namespace moe::model
