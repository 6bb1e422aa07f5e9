// The multi-token prediction module of Model (DeepSeek-V3: one extra block that predicts token
// t+2 from the last hidden state and the embedding of token t+1), forward and backward.
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
  mb.mtp_targets.resize(n, nullptr, device());
  device_copy(device(), mb.mtp_targets.data(), Device::kCpu, tg.data(), n * sizeof(int32_t));
  // The module's input: embed(t+1) (the main targets) and the normed state, each normed again.
  for (Buffer<float>* b : {&mb.mtp_e, &mb.mtp_en, &mb.mtp_hn}) b->resize_for_overwrite(nH, mem, device());
  for (Buffer<float>* b : {&mb.mtp_rstd_e, &mb.mtp_rstd_h}) b->resize_for_overwrite(n, mem, device());
  k::embedding_forward(mb.mtp_e.data(), mb.targets.data(), w_.embed, n, H);
  k::rmsnorm_forward(mb.mtp_en.data(), mb.mtp_rstd_e.data(), mb.mtp_e.data(), M.enorm, n, H, c.rms_norm_eps);
  k::rmsnorm_forward(mb.mtp_hn.data(), mb.mtp_rstd_h.data(), mb.final_ln.data(), M.hnorm, n, H,
                     c.rms_norm_eps);
  mb.mtp_layer = std::make_unique<LayerActs>();
  LayerActs& a = *mb.mtp_layer;
  a.x.resize_for_overwrite(nH, mem, device());
  // eh_proj [H, 2H] over the concatenation, as two products into its column blocks.
  k::gemm(false, true, n, H, H, 1.0f, mb.mtp_en.data(), H, M.eh_proj, 2 * H, 0.0f, a.x.data(), H);
  k::gemm(false, true, n, H, H, 1.0f, mb.mtp_hn.data(), H, M.eh_proj + H, 2 * H, 1.0f, a.x.data(), H);
  Buffer<float> out;
  out.resize_for_overwrite(nH, mem, device());
  layer_forward(L, a, out.data(), B, T, mem);  // every activation kept, whatever --recompute says
  mb.mtp_ln.resize_for_overwrite(nH, mem, device());
  mb.mtp_rstd.resize_for_overwrite(n, mem, device());
  k::rmsnorm_forward(mb.mtp_ln.data(), mb.mtp_rstd.data(), out.data(), M.norm, n, H, c.rms_norm_eps);
  mb.mtp_logits.resize_for_overwrite(static_cast<size_t>(n) * V, mem, device());
  k::linear_forward(mb.mtp_logits.data(), mb.mtp_ln.data(), w_.lm_head, n, H, V);
  mb.mtp_probs.resize_for_overwrite(static_cast<size_t>(n) * V, mem, device());
  mb.mtp_losses.resize_for_overwrite(n, mem, device());
  k::cross_entropy_forward(mb.mtp_losses.data(), mb.mtp_probs.data(), mb.mtp_logits.data(),
                           mb.mtp_targets.data(), n, V);
  std::vector<float> row_loss(n);
  device_copy(Device::kCpu, row_loss.data(), device(), mb.mtp_losses.data(), n * sizeof(float));
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
  Buffer<float> dlogits(static_cast<size_t>(n) * V, work, device());
  k::cross_entropy_backward(dlogits.data(), mb.mtp_probs.data(), mb.mtp_targets.data(), n, V,
                            loss_scale * mtp_weight_ * mb.mtp_row_scale);
  for (int i : mb.mtp_masked) k::fill_zero(dlogits.data() + static_cast<size_t>(i) * V, V);
  Buffer<float> dln(nH, work, device()), dx(nH, work, device());
  k::linear_backward(dln.data(), g_.lm_head, dlogits.data(), mb.mtp_ln.data(), w_.lm_head, n, H, V);
  k::rmsnorm_backward(dx.data(), MG.norm, dln.data(), mb.mtp_out.data(), M.norm, mb.mtp_rstd.data(), n, H);
  layer_backward(L, *mb.mtp_layer, dx.data(), B, T, loss_scale);  // dx: d(block input)
  Buffer<float> den(nH, work, device()), dhn(nH, work, device());
  // y = en · W[:, :H]^T + hn · W[:, H:]^T: dW blocks += dy^T · input, d(input) = dy · W block.
  k::gemm(true, false, H, H, n, 1.0f, dx.data(), H, mb.mtp_en.data(), H, 1.0f, MG.eh_proj, 2 * H);
  k::gemm(true, false, H, H, n, 1.0f, dx.data(), H, mb.mtp_hn.data(), H, 1.0f, MG.eh_proj + H, 2 * H);
  k::gemm(false, false, n, H, H, 1.0f, dx.data(), H, M.eh_proj, 2 * H, 0.0f, den.data(), H);
  k::gemm(false, false, n, H, H, 1.0f, dx.data(), H, M.eh_proj + H, 2 * H, 0.0f, dhn.data(), H);
  Buffer<float> de(nH, work, device());
  k::rmsnorm_backward(de.data(), MG.enorm, den.data(), mb.mtp_e.data(), M.enorm, mb.mtp_rstd_e.data(), n, H);
  k::embedding_backward(g_.embed, de.data(), mb.targets.data(), n, H);
  k::rmsnorm_backward(d_final_ln, MG.hnorm, dhn.data(), mb.final_ln.data(), M.hnorm, mb.mtp_rstd_h.data(),
                      n, H);
}

}  // namespace moe::model
