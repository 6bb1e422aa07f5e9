#include "train/validation.h"

#include "core/buffer.h"
#include "kernels/device_select.h"
#include "train/step_figures.h"

namespace moe::train {

double validation_loss(model::Model& m, const std::vector<int32_t>& val, int B_local, int T,
                       int n, const parallel::Grid& g) {
  const size_t per_global = static_cast<size_t>(B_local) * g.data_size() * (T + 1);
  const size_t offset = static_cast<size_t>(g.data_rank()) * B_local * (T + 1);
  const model::StageSpec& st = m.stage();
  const size_t act = static_cast<size_t>(B_local) * T / m.tp_size() * m.config().hidden_size;
  // Where the model reads its input and writes its output: the active device (a GPU's buffers are
  // staged through the host by the blocking send/recv).
  Buffer<float> x_in(st.embedding ? 0 : act, nullptr, kernels::active_device());
  Buffer<float> x_out(st.head ? 0 : act, nullptr, kernels::active_device());
  auto mb = m.new_micro_batch();
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const int32_t* tok = val.data() + i * per_global + offset;
    if (!st.embedding) g.pp.recv(x_in.data(), static_cast<int64_t>(act), g.pp.rank() - 1, 1000 + i);
    model::LossParts lp = m.forward(*mb, tok, st.embedding ? nullptr : x_in.data(),
                                    st.head ? nullptr : x_out.data(), B_local, T, /*keep=*/false);
    if (!st.head) g.pp.send(x_out.data(), static_cast<int64_t>(act), g.pp.rank() + 1, 1000 + i);
    sum += lp.ce;
  }
  double v = sum / n;  // non-zero on the last stage only
  if (g.pp.size() > 1) g.pp.allreduce_sum(&v, 1);
  return data_mean(g, v);
}

}  // namespace moe::train
