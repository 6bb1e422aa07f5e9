// See device_select.h.
#include "kernels/device_select.h"

#ifdef MOETRAIN_HAVE_CUDA
#include "kernels/cuda/context.h"
#endif

namespace moe::kernels {

void device_synchronize() {
#ifdef MOETRAIN_HAVE_CUDA
  if (cuda_active()) cuda::synchronize("device_synchronize");
#endif
}

}  // namespace moe::kernels
