// cub::DeviceRadixSort: CUB's own under nvcc, the SIMT shim's CPU implementation with the same
// contract under a host compiler (kernels/simt/cub_fake.h).
#pragma once
#ifdef __CUDACC__
#include <cub/device/device_radix_sort.cuh>
#else
#include "kernels/simt/cub_fake.h"
#endif
