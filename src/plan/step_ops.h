// What one micro-batch computes, layer by layer, as the trainer runs it: GEMMs by form and shape,
// attention calls, and the activation elements that memory-bound work is charged for. The time
// model prices this one description with a profile's tables; `moetrain calibrate` replays it
// with the real kernels (so the two cannot describe different work).
// A linear layer y[M,out] = x[M,in] · w[out,in]ᵀ is a forward nt(M, out, in) and a backward
// nn(M, in, out) (dx) + tn(out, in, M) (dw), the forms of kernels/gemm.cpp.
#pragma once
#include <vector>

#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/plan_model.h"

namespace moe::plan {

enum class GemmForm {  // C[m,n] = op(A)[m,k] · op(B)[k,n]
  kNT,
  kNN,
  kTN
};

struct GemmOp {
  GemmForm form = GemmForm::kNT;
  double m = 0, n = 0, k = 0;
  double count = 1;
};

struct AttentionOp {
  double seq_heads = 0;  // (sequence, head) pairs
  double seq_len = 0;
  double head_dim = 0;
  bool backward = false;
};

struct PassOps {
  std::vector<GemmOp> gemms;
  std::vector<AttentionOp> attention;
  double elems = 0;  // activation elements charged with memory-bound work
  void add(const PassOps& o);
};

// A linear layer of M rows, `count` times: its forward GEMM into fwd, its two backward GEMMs into bwd.
void add_linear(PassOps& fwd, PassOps& bwd, double M, double in, double out, double count = 1);

struct LayerOps {
  PassOps attn_fwd, attn_bwd;  // projections + attention core + memory-bound
  PassOps ffn_fwd, ffn_bwd;    // dense FFN, or router + experts + shared + memory-bound
  bool moe = false;
  double rows = 0;      // expert rows of the busiest rank
  double a2a_rows = 0;  // rows the all-to-all is paced by (bytes = a2a_rows · H · B):
                        // the busiest rank's, or node's when the EP group spans nodes
  double dropped = 0;   // elements forward drops and backward recomputes
};

// Layer l for one micro-batch of `rs` on a rank of `lay`. The busiest rank's expert rows use
// mo.time_imbalance (measured routing), the balanced N·k rows otherwise.
LayerOps layer_ops(const PlanModel& m, int l, const Layout& lay, const RankShape& rs, int seq_len,
                   const MemoryOptions& mo);
// Final norm + LM head + loss (last stage) and the embedding lookup (first stage), on the
// N / tp tokens of a rank's sequence shard.
void head_ops(const PlanModel& m, const RankShape& rs, int tp, PassOps& fwd, PassOps& bwd);
double embedding_elems(const PlanModel& m, const RankShape& rs, int tp);

}  // namespace moe::plan
