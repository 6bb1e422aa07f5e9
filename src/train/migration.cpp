#include "train/migration.h"

#include "core/device.h"
#include "core/error.h"

namespace moe::train {

balance::Placement plan_migration(const balance::Placement& current, const std::vector<int>& moe_layer_ids,
                                  const std::vector<std::vector<double>>& loads, double threshold,
                                  std::vector<LayerMigration>* changed) {
  MOE_CHECK(loads.size() == moe_layer_ids.size(), "plan_migration: loads of ", loads.size(), " layers for ",
            moe_layer_ids.size(), " MoE layers");
  balance::Placement next = current;
  for (size_t i = 0; i < moe_layer_ids.size(); ++i) {
    const int l = moe_layer_ids[i];
    balance::LayerPlacement& p = next.layers.at(l);
    const double before = balance::imbalance(p, loads[i]);
    if (!(before > threshold)) continue;
    const std::vector<balance::SwapStep> swaps = balance::hill_climb(p, loads[i]);
    if (swaps.empty()) continue;
    if (changed)
      changed->push_back({l, static_cast<int>(swaps.size()), before, balance::imbalance(p, loads[i])});
  }
  return next;
}

double move_experts(model::Model& model, const balance::Placement& to, const comm::Group& ep,
                    const std::vector<float*>& blocks) {
  const model::ModelConfig& c = model.config();
  const balance::Placement& from = model.placement();
  MOE_CHECK(to.layers.size() == from.layers.size(), "move_experts: a placement of ", to.layers.size(),
            " layers for a model of ", from.layers.size());
  const int me = ep.valid() ? ep.rank() : 0;
  const size_t FH = static_cast<size_t>(c.moe_intermediate_size) * c.hidden_size;
  const size_t per = 3 * FH * blocks.size();  // floats of one expert: 3 projections of each block
  const Device dev = model.device();
  constexpr int kTag = 21001;  // one tag: both sides post an expert's messages in ascending order
  double sent = 0;
  const model::StageSpec& st = model.stage();
  for (int l = st.first_layer; l < st.end_layer(c); ++l) {
    const balance::LayerPlacement &A = from.layers[l], &B = to.layers[l];
    if (A.empty() || A == B) continue;
    MOE_CHECK(A.ep_size() == ep.size() && B.ep_size() == ep.size() && B.num_experts() == A.num_experts(),
              "move_experts: layer ", l, " is placed over ", B.ep_size(), " ranks, the EP group has ", ep.size());
    const model::LayerTensors& W = model.weights().layers[l];
    const size_t off[3] = {static_cast<size_t>(W.experts_gate - model.params()),
                           static_cast<size_t>(W.experts_up - model.params()),
                           static_cast<size_t>(W.experts_down - model.params())};
    const int El = A.per_rank();
    // This rank's experts of the layer on the host, by old slot; what arrives, by new slot.
    std::vector<float> old(static_cast<size_t>(El) * per), incoming(static_cast<size_t>(El) * per);
    for (int s = 0; s < El; ++s) {
      float* h = old.data() + s * per;
      for (float* b : blocks)
        for (size_t j : off) {
          device_copy(Device::kCpu, h, dev, b + j + s * FH, FH * sizeof(float));
          h += FH;
        }
    }
    std::vector<comm::Request> reqs;
    for (int e = 0; e < A.num_experts(); ++e)
      if (B.rank_of(e) == me && A.rank_of(e) != me)
        reqs.push_back(ep.irecv(incoming.data() + B.slot_of(e) * per, static_cast<int64_t>(per), A.rank_of(e), kTag));
    for (int e = 0; e < A.num_experts(); ++e) {
      if (A.rank_of(e) != me || B.rank_of(e) == me) continue;
      reqs.push_back(ep.isend(old.data() + A.slot_of(e) * per, static_cast<int64_t>(per), B.rank_of(e), kTag));
      sent += static_cast<double>(per) * sizeof(float);
    }
    comm::wait_all(reqs);
    for (int e = 0; e < B.num_experts(); ++e) {
      if (B.rank_of(e) != me) continue;
      const bool stays = A.rank_of(e) == me;
      if (stays && A.slot_of(e) == B.slot_of(e)) continue;
      const float* h = stays ? old.data() + A.slot_of(e) * per : incoming.data() + B.slot_of(e) * per;
      const int s = B.slot_of(e);
      for (float* b : blocks)
        for (size_t j : off) {
          device_copy(dev, b + j + s * FH, Device::kCpu, h, FH * sizeof(float));
          h += FH;
        }
    }
  }
  model.set_placement(to);
  return sent;
}

}  // namespace moe::train
