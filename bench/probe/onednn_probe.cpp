// Probes behind the README's notes on the CPU's limits (built and run by scripts/onednn_probe.sh;
// one thread, nothing of moetrain linked):
//   bw                       one core's memory read and copy rate over 256 MiB
//   bf16-experts E M N K     E expert products x[M,K] · W[N,K]^T in bf16 (fp32 out), cold weights:
//                            oneDNN's run-time-size primitive (what moetrain uses), a fixed-size
//                            one, and fixed-size row chunks on weights reordered once
//   fp32 E M N K TA TB BETA  E products C (+)= op(A) op(B): OpenBLAS against oneDNN's fp32 matmul
//   gate-up E M H F          E experts of M rows: the SwiGLU gate and up products (forward, their
//                            weight gradients and dx) in OpenBLAS fp32 as moetrain runs them (two
//                            [F,H] weights, two GEMMs per part) and merged (one [2F,H] weight a
//                            expert, one GEMM per part)
// Every rate is the best of a few repetitions.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dnnl.hpp>

namespace {

using dnnl::matmul;
using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The best rate over `reps` calls of f (units / seconds, f's units).
template <class F>
double best_rate(int reps, double units, F f) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::max(best, units / (now() - t0));
  }
  return best;
}

void bandwidth() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  const double copy = best_rate(4, n / 1e9, [&] { std::memcpy(b.data(), a.data(), n); });
  volatile float sink = 0;
  const double read = best_rate(4, n / 1e9, [&] {
    const float* f = reinterpret_cast<const float*>(a.data());
    float acc[16] = {};
    for (size_t i = 0; i < n / 4; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += f[i + j];
    sink = sink + acc[0];
  });
  std::printf("one core, 256 MiB: read %.1f GB/s, memcpy %.1f GB/s (bytes copied per second)\n", read, copy);
}

void bf16_experts(int E, int M, int N, int K) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::vector<uint16_t> A(static_cast<size_t>(E) * M * K), B(static_cast<size_t>(E) * K * N);
  for (auto& x : A) x = static_cast<uint16_t>(0x3f00 + (std::rand() & 0xff));
  for (auto& x : B) x = static_cast<uint16_t>(0x3c00 + (std::rand() & 0xff));
  std::vector<float> C(static_cast<size_t>(E) * M * N);
  const double gflop = 2.0 * E * M * N * K / 1e9;
  const memory::desc ar({M, K}, dt::bf16, tag::ab), br({K, N}, dt::bf16, tag::ba), cr({M, N}, dt::f32, tag::ab);
  auto run_all = [&](const matmul& mm, int rows, const std::vector<memory>* packed) {
    const memory::desc a({rows, K}, dt::bf16, tag::ab), c({rows, N}, dt::f32, tag::ab);
    for (int e = 0; e < E; ++e)
      for (int r = 0; r + rows <= M; r += rows) {
        memory am(rows == M ? ar : a, eng, A.data() + (static_cast<size_t>(e) * M + r) * K);
        memory cm(rows == M ? cr : c, eng, C.data() + (static_cast<size_t>(e) * M + r) * N);
        memory bm = packed ? (*packed)[e] : memory(br, eng, B.data() + static_cast<size_t>(e) * K * N);
        mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      }
    s.wait();
  };
  const auto R = DNNL_RUNTIME_DIM_VAL;
  for (bool fixed : {false, true}) {
    const memory::desc a({fixed ? M : R, K}, dt::bf16, tag::ab), c({fixed ? M : R, N}, dt::f32, tag::ab);
    const matmul::primitive_desc pd(matmul::desc(a, br, c), eng);
    const double t0 = now();
    const matmul mm(pd);
    const double created = now() - t0;
    const double rate = best_rate(3, gflop, [&] { run_all(mm, M, nullptr); });
    std::printf("bf16 %d experts %dx%dx%d, %s sizes: %-28s %6.0f GFLOP/s (primitive created in %.2f ms)\n", E, M, N,
                K, fixed ? "fixed" : "run-time", pd.impl_info_str(), rate, created * 1e3);
  }
  for (int rows : {32, 64, 128}) {
    if (M % rows) continue;
    const memory::desc a({rows, K}, dt::bf16, tag::ab), any({K, N}, dt::bf16, tag::any), c({rows, N}, dt::f32, tag::ab);
    const matmul::primitive_desc pd(matmul::desc(a, any, c), eng);
    const matmul mm(pd);
    std::vector<memory> packed;
    const double t0 = now();
    for (int e = 0; e < E; ++e) {
      memory src(br, eng, B.data() + static_cast<size_t>(e) * K * N), dst(pd.weights_desc(), eng);
      dnnl::reorder(src, dst).execute(s, src, dst);
      packed.push_back(dst);
    }
    s.wait();
    const double reorder_s = now() - t0;
    const double rate = best_rate(3, gflop, [&] { run_all(mm, rows, &packed); });
    std::printf("bf16 %d experts, %d-row chunks on reordered weights: %-20s %6.0f GFLOP/s (reorder %.0f ms)\n", E,
                rows, pd.impl_info_str(), rate, reorder_s * 1e3);
  }
}

void fp32(int E, int M, int N, int K, bool ta, bool tb, float beta) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::vector<float> A(static_cast<size_t>(E) * M * K), B(static_cast<size_t>(E) * K * N), C(static_cast<size_t>(E) * M * N);
  for (auto& x : A) x = static_cast<float>(std::rand()) / RAND_MAX;
  for (auto& x : B) x = static_cast<float>(std::rand()) / RAND_MAX;
  const double gflop = 2.0 * E * M * N * K / 1e9;
  const double blas = best_rate(4, gflop, [&] {
    for (int e = 0; e < E; ++e)
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                  A.data() + static_cast<size_t>(e) * M * K, ta ? M : K, B.data() + static_cast<size_t>(e) * K * N,
                  tb ? K : N, beta, C.data() + static_cast<size_t>(e) * M * N, N);
  });
  const auto R = DNNL_RUNTIME_DIM_VAL;
  const memory::desc a({R, R}, dt::f32, ta ? tag::ba : tag::ab), b({R, R}, dt::f32, tb ? tag::ba : tag::ab),
      c({R, R}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  const matmul::primitive_desc pd(matmul::desc(a, b, c), attr, eng);
  const matmul mm(pd);
  const memory::desc ar({M, K}, dt::f32, ta ? tag::ba : tag::ab), br({K, N}, dt::f32, tb ? tag::ba : tag::ab),
      cr({M, N}, dt::f32, tag::ab);
  const double dnn = best_rate(4, gflop, [&] {
    for (int e = 0; e < E; ++e) {
      memory am(ar, eng, A.data() + static_cast<size_t>(e) * M * K), bm(br, eng, B.data() + static_cast<size_t>(e) * K * N),
          cm(cr, eng, C.data() + static_cast<size_t>(e) * M * N);
      mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    }
    s.wait();
  });
  std::printf("fp32 %d x %dx%dx%d ta=%d tb=%d beta=%g: OpenBLAS %.0f, oneDNN %s %.0f GFLOP/s (%.2fx)\n", E, M, N, K, ta,
              tb, beta, blas, pd.impl_info_str(), dnn, dnn / blas);
}

// Seconds of the best of `reps` calls of f.
template <class F>
double best_seconds(int reps, F f) {
  return 1.0 / best_rate(reps, 1.0, f);
}

void gate_up(int E, int M, int H, int F) {
  const size_t MH = static_cast<size_t>(M) * H, FH = static_cast<size_t>(F) * H, MF = static_cast<size_t>(M) * F;
  // One set of buffers serves both forms: W holds [E,F,H] gate then [E,F,H] up (moetrain's
  // stacking) or [E,2F,H] (merged); G holds g then u ([E·M,F] each) or [E·M,2F] rows.
  std::vector<float> X(E * MH), W(2 * E * FH), dW(2 * E * FH), G(2 * E * MF), dG(2 * E * MF), dX(E * MH);
  for (auto* v : {&X, &W, &dG})
    for (auto& x : *v) x = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
  auto sgemm = [](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
                  float* c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda,
                b, ldb, beta, c, ldc);
  };
  const float* x = X.data();
  float *w = W.data(), *dw = dW.data(), *g = G.data(), *dg = dG.data(), *dx = dX.data();
  const size_t up = E * FH, u = E * MF;  // the up halves of the separate form
  double sep[3], mer[3];
  sep[0] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e) {
      sgemm(false, true, M, F, H, x + e * MH, H, w + e * FH, H, 0, g + e * MF, F);
      sgemm(false, true, M, F, H, x + e * MH, H, w + up + e * FH, H, 0, g + u + e * MF, F);
    }
  });
  sep[1] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e) {
      sgemm(true, false, F, H, M, dg + e * MF, F, x + e * MH, H, 1, dw + e * FH, H);
      sgemm(true, false, F, H, M, dg + u + e * MF, F, x + e * MH, H, 1, dw + up + e * FH, H);
    }
  });
  sep[2] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e) {
      sgemm(false, false, M, H, F, dg + e * MF, F, w + e * FH, H, 0, dx + e * MH, H);
      sgemm(false, false, M, H, F, dg + u + e * MF, F, w + up + e * FH, H, 1, dx + e * MH, H);
    }
  });
  mer[0] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e) sgemm(false, true, M, 2 * F, H, x + e * MH, H, w + 2 * e * FH, H, 0, g + 2 * e * MF, 2 * F);
  });
  mer[1] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e)
      sgemm(true, false, 2 * F, H, M, dg + 2 * e * MF, 2 * F, x + e * MH, H, 1, dw + 2 * e * FH, H);
  });
  mer[2] = best_seconds(4, [&] {
    for (int e = 0; e < E; ++e) sgemm(false, false, M, H, 2 * F, dg + 2 * e * MF, 2 * F, w + 2 * e * FH, H, 0, dx + e * MH, H);
  });
  const char* part[3] = {"forward", "dW", "dx"};
  std::printf("gate+up, %d experts x %d rows, H %d, F %d (OpenBLAS fp32; ms, best of 4)\n", E, M, H, F);
  for (int i = 0; i < 3; ++i)
    std::printf("  %-8s two GEMMs %8.1f   merged %8.1f   (%+.1f)\n", part[i], sep[i] * 1e3, mer[i] * 1e3,
                (mer[i] - sep[i]) * 1e3);
  const double s3 = sep[0] + sep[1] + sep[2], m3 = mer[0] + mer[1] + mer[2];
  std::printf("  %-8s two GEMMs %8.1f   merged %8.1f   (%+.1f)\n", "total", s3 * 1e3, m3 * 1e3, (m3 - s3) * 1e3);
}

int usage() {
  std::fprintf(stderr, "usage: onednn_probe bw | bf16-experts E M N K | fp32 E M N K TA TB BETA | gate-up E M H F\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string what = argv[1];
  auto arg = [&](int i) { return std::atoi(argv[i]); };
  if (what == "bw" && argc == 2) {
    bandwidth();
  } else if (what == "bf16-experts" && argc == 6 && arg(2) > 0 && arg(3) > 0 && arg(4) > 0 && arg(5) > 0) {
    bf16_experts(arg(2), arg(3), arg(4), arg(5));
  } else if (what == "fp32" && argc == 9 && arg(2) > 0 && arg(3) > 0 && arg(4) > 0 && arg(5) > 0) {
    fp32(arg(2), arg(3), arg(4), arg(5), arg(6) != 0, arg(7) != 0, static_cast<float>(std::atof(argv[8])));
  } else if (what == "gate-up" && argc == 6 && arg(2) > 0 && arg(3) > 0 && arg(4) > 0 && arg(5) > 0) {
    gate_up(arg(2), arg(3), arg(4), arg(5));
  } else {
    return usage();
  }
  return 0;
}
