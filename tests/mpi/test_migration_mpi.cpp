// Expert migration's move (train/migration.cpp, move_experts) on real MPI processes, every expert
// stamped with its identity: each float of an expert's gate, up and down rows, in the weights and
// in AdamW's m and v, holds (block, logical expert, projection, element). After the move every
// rank's slot s must hold the expert the new map puts there, in all three arrays. The maps cover
// what a hill climb produces: experts that stay on their rank but change slot (slots permuted
// within a rank, the branch no end-to-end run reached), experts that change rank, both in one
// layer, and a layer left as it was.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "balance/placement.h"
#include "comm/mpi_runtime.h"
#include "model/config.h"
#include "model/model.h"
#include "moe/moe_layer.h"
#include "mpi_check.h"
#include "train/migration.h"

namespace moe {
namespace {

// Exact in float (below 2^24): block b (0 weights, 1 m, 2 v), expert e, projection p, element j.
float stamp(int b, int e, int p, size_t j) {
  return static_cast<float>(b * 4000000 + e * 100000 + p * 20000 + static_cast<int>(j % 20000));
}

// Rank r's experts of one layer in slot order, for a map chosen by `kind`:
//  0: slots reversed on every rank (every expert stays on its rank, most change slot);
//  1: ranks rotated by one and slots reversed (every expert changes rank; P = 1: kind 0);
//  2: the first expert of each rank swapped with the last of the next rank, the rest of each
//     rank's experts rotated by one slot (both kinds of move in one layer).
std::vector<std::vector<int>> target(const balance::LayerPlacement& A, int kind) {
  const int P = A.ep_size(), El = A.per_rank();
  std::vector<std::vector<int>> at(P);
  for (int r = 0; r < P; ++r) at[r] = A.experts_of(r);
  if (kind == 0 || (kind == 1 && P == 1)) {
    for (auto& v : at) std::vector<int>(v.rbegin(), v.rend()).swap(v);
  } else if (kind == 1) {
    std::vector<std::vector<int>> rot(P);
    for (int r = 0; r < P; ++r) rot[(r + 1) % P] = std::vector<int>(at[r].rbegin(), at[r].rend());
    at = rot;
  } else {
    if (P > 1)
      for (int r = 0; r < P; r += 2)
        if (r + 1 < P) std::swap(at[r][0], at[r + 1][El - 1]);
    for (auto& v : at)
      if (El > 2) std::rotate(v.begin() + 1, v.begin() + 2, v.end());
  }
  return at;
}

void run(const comm::Group& ep) {
  const int P = ep.size(), me = ep.rank();
  model::ModelConfig cfg = model::preset("test-moe");
  cfg.num_hidden_layers = 5;     // 1 dense + 4 MoE layers: one per kind of map, one kept
  cfg.n_routed_experts = 4 * P;  // 4 experts per rank
  mixture::ExpertParallel xp;
  xp.rank = me;
  xp.size = P;
  model::Model model(cfg, {}, &xp);
  const size_t n = model.num_params();
  const size_t FH = static_cast<size_t>(cfg.moe_intermediate_size) * cfg.hidden_size;
  std::vector<float> m(n, -1.0f), v(n, -2.0f);
  float* blocks[3] = {model.params(), m.data(), v.data()};
  const balance::Placement from = model.placement();
  auto slot_ptr = [&](int b, int l, int p, int s) {
    const model::LayerTensors& W = model.weights().layers[l];
    const float* base = p == 0 ? W.experts_gate : (p == 1 ? W.experts_up : W.experts_down);
    return blocks[b] + (base - model.params()) + static_cast<size_t>(s) * FH;
  };
  std::vector<int> moe_layers;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.is_moe_layer(l)) moe_layers.push_back(l);
  CHECK(moe_layers.size() == 4, "test-moe with 5 layers has 4 MoE layers, got ", moe_layers.size());
  for (int l : moe_layers) {
    const balance::LayerPlacement& A = from.layers[l];
    for (int s = 0; s < A.per_rank(); ++s)
      for (int b = 0; b < 3; ++b)
        for (int p = 0; p < 3; ++p) {
          float* x = slot_ptr(b, l, p, s);
          for (size_t j = 0; j < FH; ++j) x[j] = stamp(b, A.expert_at(me, s), p, j);
        }
  }
  balance::Placement to = from;
  for (size_t i = 0; i + 1 < moe_layers.size(); ++i) {
    const int l = moe_layers[i];
    to.layers[l] = balance::LayerPlacement::from_ranks(target(from.layers[l], static_cast<int>(i)), "test map");
  }
  // Every rank's stamped values survive: what this rank holds before, by (layer, slot).
  const double sent = train::move_experts(model, to, ep, {blocks[0], blocks[1], blocks[2]});
  CHECK(model.placement() == to, "the model's map is the new one after the move");
  int64_t wrong = 0, first_wrong_layer = -1;
  for (int l : moe_layers) {
    const balance::LayerPlacement& B = to.layers[l];
    for (int s = 0; s < B.per_rank(); ++s) {
      const int e = B.expert_at(me, s);
      for (int b = 0; b < 3; ++b)
        for (int p = 0; p < 3; ++p) {
          const float* x = slot_ptr(b, l, p, s);
          int64_t bad = 0;
          for (size_t j = 0; j < FH; ++j) bad += x[j] != stamp(b, e, p, j);
          if (bad && first_wrong_layer < 0) first_wrong_layer = l;
          wrong += bad;
          CHECK(bad == 0, "layer ", l, " slot ", s, " (expert ", e, ", from rank ", from.layers[l].rank_of(e),
                " slot ", from.layers[l].slot_of(e), ") ", b == 0 ? "weights" : (b == 1 ? "AdamW m" : "AdamW v"),
                " projection ", p, ": ", bad, " of ", FH, " floats are not that expert's (first: ",
                x[0], ", expected ", stamp(b, e, p, 0), ")");
        }
    }
  }
  // Bytes: only experts that change rank travel, 9 arrays of F·H floats each.
  int64_t leaving = 0;
  for (int l : moe_layers)
    for (int e = 0; e < cfg.n_routed_experts; ++e)
      leaving += from.layers[l].rank_of(e) == me && to.layers[l].rank_of(e) != me;
  CHECK(sent == static_cast<double>(leaving) * 9 * FH * sizeof(float), "rank ", me, " sent ", sent,
        " bytes, expected ", leaving, " experts x 9 x ", FH, " floats");
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::comm::MpiRuntime mpi(&argc, &argv);
  int exit_code = 0;
  try {
    moe::comm::Group world = moe::comm::Group::world();
    moe::mpitest::ck.rank = world.rank();
    moe::run(world);
    exit_code = moe::mpitest::ck.report(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_test_migration: %s\n", e.what());
    moe::comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
