// The cuBLAS calls moetrain makes, on the emulated device (SIMT shim builds): cublasGemmEx and
// cublasGemmGroupedBatchedEx with cuBLAS's column-major semantics, computed by the CPU BLAS in fp32
// (bf16 operands are exact in fp32, so a bf16 product is what cuBLAS's fp32 accumulation of the
// same operands gives, up to summation order). Every argument check cuBLAS documents comes first,
// returning its status codes: a null handle is NOT_INITIALIZED; negative sizes, an unknown
// operation, lda < max(1, rows of A as stored) (likewise ldb, ldc) or null scalars are
// INVALID_VALUE; a type / compute-type combination outside the table below is NOT_SUPPORTED.
// Operands that are not device memory of the extent the shapes imply fail when the product runs
// (the sticky launch failure a GPU fault gives), naming the call and the operand.
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/simt/simt_device.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace moe::simt {
namespace {

std::string g_detail;

cublasStatus_t refuse(cublasStatus_t st, std::string why) {
  g_detail = std::move(why);
  return st;
}

bool is_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

// The combinations implemented (cuBLAS's table has more; moetrain uses these).
bool supported(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cublasComputeType_t ct) {
  const bool f32 = ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC ||
                   ct == CUBLAS_COMPUTE_32F_FAST_TF32 || ct == CUBLAS_COMPUTE_32F_FAST_16BF;
  if (!f32 || a != b) return false;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  if (a == CUDA_R_16BF) return c == CUDA_R_32F || c == CUDA_R_16BF;
  return false;
}

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }
const char* type_name(cudaDataType_t t) {
  return t == CUDA_R_32F ? "CUDA_R_32F" : (t == CUDA_R_16BF ? "CUDA_R_16BF" : "another type");
}

struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha, beta;
  const void* A;
  const void* B;
  void* C;
  cudaDataType_t at, bt, ct;
  int lda, ldb, ldc;
};

// Argument checks of one product (group `g` of a grouped call, or -1), in cuBLAS's order.
cublasStatus_t check(const Gemm& p, const char* call, int g) {
  const std::string who = g < 0 ? std::string(call) : std::string(call) + " group " + std::to_string(g);
  if (!is_op(p.ta) || !is_op(p.tb))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, who + ": unknown operation");
  if (p.m < 0 || p.n < 0 || p.k < 0)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, who + ": negative size m=" + std::to_string(p.m) +
                                                   " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k));
  const int a_rows = p.ta == CUBLAS_OP_N ? p.m : p.k, b_rows = p.tb == CUBLAS_OP_N ? p.k : p.n;
  auto ld = [&](const char* name, int v, int rows) -> cublasStatus_t {
    if (v >= (rows > 1 ? rows : 1)) return CUBLAS_STATUS_SUCCESS;
    return refuse(CUBLAS_STATUS_INVALID_VALUE, who + ": " + name + "=" + std::to_string(v) +
                                                   " < max(1, " + std::to_string(rows) + ")");
  };
  if (auto s = ld("lda", p.lda, a_rows); s != CUBLAS_STATUS_SUCCESS) return s;
  if (auto s = ld("ldb", p.ldb, b_rows); s != CUBLAS_STATUS_SUCCESS) return s;
  if (auto s = ld("ldc", p.ldc, p.m); s != CUBLAS_STATUS_SUCCESS) return s;
  return CUBLAS_STATUS_SUCCESS;
}

// Column-major [rows x cols] with leading dimension ld, as fp32 (device access is open).
std::vector<float> load(const char* who, const char* name, const void* p, cudaDataType_t t, int rows,
                        int cols, int ld) {
  const size_t extent = cols == 0 || rows == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows;
  if (extent && !device_range(p, extent * type_bytes(t))) {
    char at[32];
    std::snprintf(at, sizeof at, "%p", p);
    throw std::runtime_error(std::string(who) + ": " + name + " (" + at + ", " +
                             std::to_string(rows) + " x " + std::to_string(cols) + ", ld " +
                             std::to_string(ld) + ") is not device memory of " +
                             std::to_string(extent) + " " + type_name(t) + " elements");
  }
  std::vector<float> out(extent);
  if (t == CUDA_R_32F) {
    const float* f = static_cast<const float*>(p);
    out.assign(f, f + extent);
  } else {
    const __nv_bfloat16* h = static_cast<const __nv_bfloat16*>(p);
    for (size_t i = 0; i < extent; ++i) out[i] = __bfloat162float(h[i]);
  }
  return out;
}

void run(const Gemm& p, const char* who) {
  if (p.m == 0 || p.n == 0) return;
  const int a_rows = p.ta == CUBLAS_OP_N ? p.m : p.k, a_cols = p.ta == CUBLAS_OP_N ? p.k : p.m;
  const int b_rows = p.tb == CUBLAS_OP_N ? p.k : p.n, b_cols = p.tb == CUBLAS_OP_N ? p.n : p.k;
  std::vector<float> c = load(who, "C", p.C, p.ct, p.m, p.n, p.ldc);
  if (p.beta == 0.0f) std::fill(c.begin(), c.end(), 0.0f);  // C is not read when beta == 0
  if (p.k == 0) {
    for (float& x : c) x *= p.beta;
  } else {
    const std::vector<float> a = load(who, "A", p.A, p.at, a_rows, a_cols, p.lda);
    const std::vector<float> b = load(who, "B", p.B, p.bt, b_rows, b_cols, p.ldb);
    cblas_sgemm(CblasColMajor, p.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                p.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, p.m, p.n, p.k, p.alpha, a.data(),
                p.lda, b.data(), p.ldb, p.beta, c.data(), p.ldc);
  }
  // Only the m x n elements are written (the rows between m and ldc are left alone).
  for (int j = 0; j < p.n; ++j)
    for (int i = 0; i < p.m; ++i) {
      const size_t o = static_cast<size_t>(j) * p.ldc + i;
      if (p.ct == CUDA_R_32F) static_cast<float*>(p.C)[o] = c[o];
      else static_cast<__nv_bfloat16*>(p.C)[o] = __float2bfloat16_rn(c[o]);
    }
}

}  // namespace

const std::string& cublas_detail() { return g_detail; }

}  // namespace moe::simt

extern "C" {

const char* cublasGetStatusName(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t st) { return cublasGetStatusName(st); }

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return moe::simt::refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: null handle");
  *handle = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return moe::simt::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy: null handle");
  (void)cudaDeviceSynchronize();
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return moe::simt::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream: null handle");
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return moe::simt::refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode: null handle");
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  using namespace moe::simt;
  if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGemmEx: null handle");
  if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: null alpha or beta");
  if (!supported(Atype, Btype, Ctype, computeType))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  std::string("cublasGemmEx: A ") + type_name(Atype) + ", B " + type_name(Btype) +
                      ", C " + type_name(Ctype) + " with compute type " +
                      std::to_string(static_cast<int>(computeType)) + " is not supported");
  const Gemm p{transa, transb, m, n, k, *static_cast<const float*>(alpha),
               *static_cast<const float*>(beta), A, B, C, Atype, Btype, Ctype, lda, ldb, ldc};
  if (auto s = check(p, "cublasGemmEx", -1); s != CUBLAS_STATUS_SUCCESS) return s;
  if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  enqueue("cublasGemmEx", [p] { run(p, "cublasGemmEx"); });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  using namespace moe::simt;
  const char* call = "cublasGemmGroupedBatchedEx";
  if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, std::string(call) + ": null handle");
  if (group_count < 0)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": group_count " + std::to_string(group_count));
  if (group_count == 0) return CUBLAS_STATUS_SUCCESS;
  if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array ||
      !beta_array || !lda_array || !ldb_array || !ldc_array || !group_size || !Aarray || !Barray ||
      !Carray)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": a null argument array");
  // cuBLAS: A and B of the same type, C bf16 or fp32 only with bf16 / fp32 inputs of its own type
  // (bf16 inputs give bf16 outputs), fp32 compute.
  const bool types_ok = Atype == Btype && Atype == Ctype &&
                        (Atype == CUDA_R_32F || Atype == CUDA_R_16BF) &&
                        supported(Atype, Btype, Ctype, computeType);
  if (!types_ok)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": A " + type_name(Atype) +
                                                   ", B " + type_name(Btype) + ", C " +
                                                   type_name(Ctype) + " is not supported");
  // The shapes, scalars and group sizes are host arrays; Aarray, Barray and Carray are device
  // arrays of device pointers, one per problem (sum of group_size), read when the product runs.
  std::vector<Gemm> all;
  for (int g = 0; g < group_count; ++g) {
    if (group_size[g] < 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": group_size[" +
                                                     std::to_string(g) + "] = " + std::to_string(group_size[g]));
    const Gemm p{transa_array[g], transb_array[g], m_array[g], n_array[g], k_array[g],
                 static_cast<const float*>(alpha_array)[g], static_cast<const float*>(beta_array)[g],
                 nullptr, nullptr, nullptr, Atype, Btype, Ctype, lda_array[g], ldb_array[g], ldc_array[g]};
    if (auto s = check(p, call, g); s != CUBLAS_STATUS_SUCCESS) return s;
    for (int i = 0; i < group_size[g]; ++i) all.push_back(p);
  }
  const size_t bytes = all.size() * sizeof(void*);
  if (!device_range(Aarray, bytes) || !device_range(Barray, bytes) || !device_range(Carray, bytes))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  std::string(call) + ": Aarray, Barray and Carray must be device arrays of " +
                      std::to_string(all.size()) + " pointers");
  if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  enqueue(call, [all, call, Aarray, Barray, Carray]() mutable {
    for (size_t i = 0; i < all.size(); ++i) {
      all[i].A = Aarray[i];
      all[i].B = Barray[i];
      all[i].C = Carray[i];
      run(all[i], call);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
