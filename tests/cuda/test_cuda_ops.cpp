// The CUDA leaf kernels against the CPU ones, test-backend-ops style: the device mode of the op
// table (tests/ops/op_table.h). Every op of the table with a CUDA twin (GEMM with its strides,
// bf16 and grouped calls; the model's layers; copies; MLA's head assembly; AdamW; the MoE layout,
// permutation and router kernels) runs its entries' device checks at the device shapes
// (device_ops(): block and warp edges, empty inputs, refusals). Each check fills the inputs, runs
// the CPU kernel with the active device cpu and the kernels::cuda one on device copies of the
// same inputs, and compares every output. Gradient outputs are pre-filled with nonzero values on
// both sides, so the += contract is checked too. Error = normalised mean squared error (ggml's
// NMSE):
//   nmse = Σ (gpu - cpu)² / Σ cpu²
// with the bound stated per check; index outputs (layouts, top-k ids, counts) must match exactly.
// One line per case; exit 1 on any failure, 77 (ctest: skipped) without a visible GPU.
#include <algorithm>
#ifdef MOETRAIN_EMULATED_CUDA
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "kernels/simt/simt_cpu.h"
#endif
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/context.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"
#include "ops/op_device.h"
#include "ops/op_table.h"

namespace {

using moe::ops::Checker;

struct OpCase {
  std::string name;
  std::string shape;
  double bound;  // NMSE bound of the float outputs
  std::function<void(Checker&)> run;
};

// Every device check of the op table at its device shapes, in table order.
std::vector<OpCase> all_ops() {
  std::vector<OpCase> ops;
  for (const moe::ops::Op& op : moe::ops::device_ops())
    for (const moe::ops::DeviceCheck& check : op.device)
      ops.push_back({check.name, op.shape, check.bound, check.run});
  return ops;
}

}  // namespace

#ifdef MOETRAIN_EMULATED_CUDA
std::pair<int, int> run_simt_refusals();  // simt_refusals.cpp: (cases, failed)

// The __global__ functions of the backend's source (src/kernels/cuda/*.cu), by name.
std::vector<std::string> global_functions() {
  std::vector<std::string> names;
  const std::filesystem::path dir = std::filesystem::path(MOETRAIN_SOURCE_DIR) / "src/kernels/cuda";
  const std::regex re(R"(__global__\s+void\s+(\w+)\s*\()");
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".cu") continue;
    std::ifstream in(f.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
      names.push_back((*it)[1]);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "N of M __global__ functions executed", naming the ones that never ran; false unless all ran.
bool kernel_count_line() {
  std::set<std::string> ran;
  for (const auto& [name, n] : moe::simt::kernels_run()) ran.insert(name);
  const std::vector<std::string> all = global_functions();
  std::string missing;
  int hit = 0;
  for (const std::string& k : all) {
    if (ran.count(k)) ++hit;
    else missing += " " + k;
  }
  std::printf("kernels executed: %d of %zu __global__ functions in src/kernels/cuda%s%s\n", hit,
              all.size(), missing.empty() ? "" : "; never ran:", missing.c_str());
  return hit == static_cast<int>(all.size()) && !all.empty();
}
#endif

int main(int argc, char** argv) {
  std::string why;
  if (moe::cuda_device_count(&why) == 0) {
    std::printf("cuda_ops: SKIPPED, no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
#ifdef MOETRAIN_EMULATED_CUDA
    if (a == "--seed" && i + 1 < argc) {
      moe::simt::set_schedule_seed(std::strtoull(argv[++i], nullptr, 10));
      continue;
    }
#endif
    std::fprintf(stderr, "usage: moetrain_cuda_tests%s\n",
#ifdef MOETRAIN_EMULATED_CUDA
                 " [--seed N]  (the SIMT shim's schedule seed)"
#else
                 ""
#endif
    );
    return 2;
  }
  int failed = 0, total = 0;
#ifdef MOETRAIN_EMULATED_CUDA
  std::printf("SIMT shim, schedule seed %llu\n",
              static_cast<unsigned long long>(moe::simt::schedule_seed()));
#endif
  std::printf("%-40s %-36s %-10s %-8s %s\n", "op", "shape", "nmse", "bound", "result");
  for (const OpCase& op : all_ops()) {
    ++total;
    Checker c;
    std::string error;
    try {
      op.run(c);
      moe::kernels::cuda::synchronize(op.name.c_str());
    } catch (const std::exception& e) {
      error = e.what();
    }
    const bool ok = error.empty() && c.exact_ok && c.worst <= op.bound;
    if (!ok) ++failed;
    std::printf("%-40s %-36s %-10.3e %-8.1e %s%s%s\n", op.name.c_str(), op.shape.c_str(), c.worst,
                op.bound, ok ? "PASS" : "FAIL", c.note.c_str(),
                error.empty() ? "" : (" error: " + error).c_str());
  }
#ifdef MOETRAIN_EMULATED_CUDA
  // The emulated GPU is this CPU: the roofline is measured once at a small size (it only shows
  // the measurement runs).
  const int roofline_n = 256, roofline_repeats = 2;
#else
  const int roofline_n = 4096, roofline_repeats = 5;
#endif
  for (bool bf16 : {false, true}) {
    ++total;
    try {
      std::printf("gemm roofline %s n=%d: %.1f GFLOP/s\n", bf16 ? "bf16" : "fp32", roofline_n,
                  moe::kernels::cuda::measure_gemm_gflops(roofline_n, roofline_repeats, bf16));
    } catch (const std::exception& e) {
      ++failed;
      std::printf("measure_gemm_gflops %s: FAIL %s\n", bf16 ? "bf16" : "fp32", e.what());
    }
  }
#ifdef MOETRAIN_EMULATED_CUDA
  ++total;
  if (!kernel_count_line()) ++failed;
  std::printf("SIMT shim refusals:\n");
  const auto [refusals, refused_wrong] = run_simt_refusals();
  failed += refused_wrong;
  total += refusals;
#endif
  std::printf("cuda_ops: %d of %d cases passed\n", total - failed, total);
  return failed ? 1 : 0;
}
