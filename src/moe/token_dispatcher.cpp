// The local and the expert-parallel token dispatchers. See token_dispatcher.h.
// Legend: T tokens, H hidden, E experts, El local experts, k slots, R kept rows (local) or
// received pairs (EP), N rows of the expert buffer (R, or E·C when padded).
#include "moe/token_dispatcher.h"

#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/permute.h"
#include "moe/dispatch.h"

namespace moe::mixture {
namespace {

// Experts all on this rank: no communication; the layout's row maps do everything.
class LocalDispatcher final : public TokenDispatcher {
 public:
  explicit LocalDispatcher(const MoeConfig& cfg) : cfg_(cfg) {}
  void plan(MoeActivations&, int) const override {}
  size_t num_rows(const MoeActivations& act) const override {
    return cfg_.padded ? act.padded_layout.num_rows() : static_cast<size_t>(act.layout.num_rows);
  }
  int num_local_experts() const override { return cfg_.num_experts; }
  const int32_t* expert_offsets(const MoeActivations& act) const override {
    return cfg_.padded ? act.padded_layout.offsets_E1.data() : act.layout.offsets_E1.data();
  }
  void dispatch(float* x_rows, const float* x, const MoeActivations& act) const override {
    if (cfg_.padded) {
      padded_dispatch_forward(x_rows, x, act.padded_layout, cfg_.hidden);
    } else {
      gather_rows_forward(x_rows, x, act.layout, cfg_.hidden);
    }
  }
  void combine(float* y, const float* y_rows, const MoeActivations& act) const override {
    const float* wt = act.routing.topk_weight_TK.data();
    if (cfg_.padded) {
      padded_combine_forward(y, y_rows, wt, act.padded_layout, cfg_.hidden, false);
    } else {
      mixture::combine_forward(y, y_rows, wt, act.layout, cfg_.hidden, false);
    }
  }
  void combine_backward(float* dy_rows, float* dweight_TK, const float* dy,
                        const MoeActivations& act) const override {
    const float* wt = act.routing.topk_weight_TK.data();
    if (cfg_.padded) {
      padded_combine_backward(dy_rows, dweight_TK, dy, act.y_rows.data(), wt, act.padded_layout,
                              cfg_.hidden);
    } else {
      mixture::combine_backward(dy_rows, dweight_TK, dy, act.y_rows.data(), wt, act.layout,
                                cfg_.hidden);
    }
  }
  void dispatch_backward(float* dx, const float* dx_rows,
                         const MoeActivations& act) const override {
    if (cfg_.padded) {
      padded_gather_backward(dx, dx_rows, act.padded_layout, cfg_.hidden);
    } else {
      gather_rows_backward(dx, dx_rows, act.layout, cfg_.hidden);
    }
  }

 private:
  const MoeConfig& cfg_;
};

// Expert parallelism over the token exchange. The placement map says where each expert lives
// (rank, local slot). Pairs leave in layout order (sorted by expert) regrouped by destination rank
// ascending (stable), and arrive in canonical order (source rank, then the source's pair order):
// whatever the placement, an expert's rows arrive by (source rank, token). The experts need them
// grouped by local slot: local_row_of_recv maps a received pair to its row in that order (stable,
// so rows of one expert keep the canonical order). The combine weights travel with the pairs:
// combine weights rows on the expert side, and combine_backward returns dLoss/dw to the token
// owners (one float per pair). With ep.placement_independent_sum each token's outputs are summed
// in layout (logical expert) order, the fold key, not by rank: moving experts keeps the math.
class ExchangeDispatcher final : public TokenDispatcher {
 public:
  explicit ExchangeDispatcher(const MoeConfig& cfg)
      : cfg_(cfg), ep_(*cfg.ep), El_(cfg.ep->num_local_experts(cfg.num_experts)) {
    MOE_CHECK(cfg.placement && cfg.placement->num_experts() == cfg.num_experts &&
                  cfg.placement->ep_size() == cfg.ep->size,
              "expert parallelism: the MoE layer has no placement of its ", cfg.num_experts, " experts over ",
              cfg.ep->size, " ranks");
  }

  void plan(MoeActivations& act, int T) const override {  // communicates (counts + metadata)
    const int E = cfg_.num_experts, k = cfg_.top_k, n = ep_.size;
    const DispatchLayout& L = act.layout;
    const balance::LayerPlacement& P = *cfg_.placement;
    const Device dev = kernels::active_device();
    // On a GPU the layout's pair order and the combine weights live there: one explicit copy of
    // each to the host per layer (a synchronisation), since the exchange's metadata is host data.
    std::vector<int32_t> slot_of_row(L.num_rows);
    std::vector<float> wt(static_cast<size_t>(T) * k);
    device_copy(Device::kCpu, slot_of_row.data(), L.slot_of_row_R.device(), L.slot_of_row_R.data(),
                slot_of_row.size() * sizeof(int32_t));
    device_copy(Device::kCpu, wt.data(), act.routing.topk_weight_TK.device(),
                act.routing.topk_weight_TK.data(), wt.size() * sizeof(float));
    // Send position of each layout row: a stable counting sort by destination rank.
    std::vector<int32_t> pos(L.num_rows), next(n + 1, 0);
    for (int e = 0; e < E; ++e) next[P.rank_of(e) + 1] += L.offsets_E1[e + 1] - L.offsets_E1[e];
    for (int d = 0; d < n; ++d) next[d + 1] += next[d];
    for (int e = 0; e < E; ++e)
      for (int r = L.offsets_E1[e]; r < L.offsets_E1[e + 1]; ++r) pos[r] = next[P.rank_of(e)]++;
    std::vector<int32_t> src_row(L.num_rows), dst_rank(L.num_rows), tag(L.num_rows), fold_key(L.num_rows);
    std::vector<float> value(L.num_rows);
    act.slot_of_pair.resize(L.num_rows);
    for (int e = 0; e < E; ++e) {
      for (int r = L.offsets_E1[e]; r < L.offsets_E1[e + 1]; ++r) {
        const int32_t slot = slot_of_row[r], q = pos[r];
        act.slot_of_pair[q] = slot;
        src_row[q] = slot / k;
        dst_rank[q] = P.rank_of(e);
        tag[q] = P.slot_of(e);  // local slot on the destination
        value[q] = wt[slot];
        fold_key[q] = r;  // layout order: logical expert, then token
      }
    }
    act.plan = ep_.exchange->plan(T, L.num_rows, src_row.data(), dst_rank.data(), tag.data(), value.data(),
                                  ep_.placement_independent_sum ? fold_key.data() : nullptr);
    const int R = act.plan.num_recv;
    // Regroup: counting sort of the received pairs by local slot.
    act.local_offsets.assign(El_ + 1, 0);
    for (int i = 0; i < R; ++i) act.local_offsets[act.plan.recv_tag[i] + 1]++;
    for (int e = 0; e < El_; ++e) act.local_offsets[e + 1] += act.local_offsets[e];
    std::vector<int32_t> fill(act.local_offsets.begin(), act.local_offsets.end() - 1);
    std::vector<int32_t> row_of_recv(R);
    for (int i = 0; i < R; ++i) row_of_recv[i] = fill[act.plan.recv_tag[i]]++;
    // Where the kernels read them (small metadata, not charged, like the host vectors it was).
    act.local_row_of_recv.resize(R, nullptr, dev);
    act.recv_value.resize(R, nullptr, dev);
    device_copy(dev, act.local_row_of_recv.data(), Device::kCpu, row_of_recv.data(),
                R * sizeof(int32_t));
    device_copy(dev, act.recv_value.data(), Device::kCpu, act.plan.recv_value.data(),
                R * sizeof(float));
  }
  size_t num_rows(const MoeActivations& act) const override {
    return static_cast<size_t>(act.plan.num_recv);
  }
  int num_local_experts() const override { return El_; }
  const int32_t* expert_offsets(const MoeActivations& act) const override {
    return act.local_offsets.data();
  }
  // Rows cross the network through the exchange, which stages device buffers through the host.
  void dispatch(float* x_rows, const float* x, const MoeActivations& act) const override {
    const int R = act.plan.num_recv, H = cfg_.hidden;
    Buffer<float> recv(static_cast<size_t>(R) * H, cfg_.scratch_tracker, kernels::active_device());
    ep_.exchange->multicast(act.plan, x, recv.data(), H);
    kernels::scatter_rows(x_rows, recv.data(), act.local_row_of_recv.data(), R, H);
  }
  void combine(float* y, const float* y_rows, const MoeActivations& act) const override {
    const int R = act.plan.num_recv, H = cfg_.hidden;
    Buffer<float> rows(static_cast<size_t>(R) * H, cfg_.scratch_tracker, kernels::active_device());
    kernels::gather_scaled_rows(rows.data(), y_rows, act.local_row_of_recv.data(),
                                act.recv_value.data(), R, H);
    kernels::fill_zero(y, static_cast<size_t>(act.plan.num_src_rows) * H);
    ep_.exchange->reduce(act.plan, rows.data(), y, H);
  }
  void combine_backward(float* dy_rows, float* dweight_TK, const float* dy,
                        const MoeActivations& act) const override {
    const int R = act.plan.num_recv, H = cfg_.hidden;
    const Device dev = kernels::active_device();
    Buffer<float> dweight_recv(R, nullptr, dev);
    {
      Buffer<float> recv(static_cast<size_t>(R) * H, cfg_.scratch_tracker, dev);
      ep_.exchange->multicast(act.plan, dy, recv.data(), H);
      kernels::gather_scaled_rows_backward(dy_rows, dweight_recv.data(), recv.data(),
                                           act.y_rows.data(), act.local_row_of_recv.data(),
                                           act.recv_value.data(), R, H);
    }
    const DispatchLayout& L = act.layout;
    std::vector<float> dweight_src(L.num_rows);
    ep_.exchange->return_values(act.plan, dweight_recv.data(), dweight_src.data());
    // Back into [T,k] slots on the host (dropped pairs keep 0), then one copy to the device.
    std::vector<float> dw(static_cast<size_t>(L.T) * L.k, 0.0f);
    for (int q = 0; q < L.num_rows; ++q) dw[act.slot_of_pair[q]] = dweight_src[q];
    device_copy(dev, dweight_TK, Device::kCpu, dw.data(), dw.size() * sizeof(float));
  }
  void dispatch_backward(float* dx, const float* dx_rows,
                         const MoeActivations& act) const override {
    const int R = act.plan.num_recv, H = cfg_.hidden;
    Buffer<float> rows(static_cast<size_t>(R) * H, cfg_.scratch_tracker, kernels::active_device());
    kernels::gather_rows_by_index(rows.data(), dx_rows, act.local_row_of_recv.data(), R, H);
    ep_.exchange->reduce(act.plan, rows.data(), dx, H);
  }

 private:
  const MoeConfig& cfg_;
  const ExpertParallel& ep_;
  int El_;
};

}  // namespace

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg) {
  if (cfg.ep && cfg.ep->exchange) return std::make_unique<ExchangeDispatcher>(cfg);
  return std::make_unique<LocalDispatcher>(cfg);
}

}  // namespace moe::mixture
