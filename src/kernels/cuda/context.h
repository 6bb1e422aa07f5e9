// The CUDA side of an execution context (kernels/exec_context.h): its stream, its cuBLAS handle
// and the kernels' cached workspaces (bf16 operand copies, sort buffers, per-row statistics,
// reduction partials), one of each per context. Host-compilable (no CUDA types here).
#pragma once

#include "core/buffer.h"

namespace moe::kernels::cuda {

// The kernels' cached workspaces, one per use: a kernel asks the current context for its own
// (reduce.cuh's workspace()) and grows it to what the call needs; it is kept for the next call.
enum class Workspace {
  kAdamwPartial,        // adamw.cu: the gradient norm's partial sums
  kAttentionRowdot,     // attention.cu: D [B, nh, T] of the backward
  kCrossEntropyLosses,  // cross_entropy.cu: [bad row | per-row loss in double]
  kEmbedding,           // elementwise.cu: sorted tokens, positions, CUB temp
  kGemmBf16,            // gemm.cu: bf16 copies of A and B
  kGemmGroupedPtrs,     // gemm.cu: gemm_grouped's A, B and C pointer arrays
  kPermuteCount,        // permute.cu: [bad pair | counts E]
  kPermuteSort,         // permute.cu: keys, values, expert starts, offsets, CUB temp
  kRmsnormPartial,      // rmsnorm.cu: the backward's per-block partial sums
  kRouterStats,         // router_ops.cu: count [B·E] | score_sum [B·E]
  kCount
};

class DeviceState;
// A context's CUDA state on the current device: the legacy default stream and a new cuBLAS handle
// (fp32 GEMMs stay fp32, no TF32). Its workspaces are charged to `scratch`.
DeviceState* make_device_state(MemTracker* scratch);

// Waits for every kernel queued so far on the current context (a CUDA twin called directly outside
// one runs on a CUDA context of the calling thread's own: context.cu); throws naming the first
// asynchronous error.
void synchronize(const char* where);

}  // namespace moe::kernels::cuda
