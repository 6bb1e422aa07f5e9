// The execution context (kernels/exec_context.h): scopes nest and restore; two contexts keep their
// own bf16 state; a worker context reads its parent's weight copy and computes beside it on
// another thread with the same bits; a model carries its context, so its forward gives the same
// loss wherever it is called from; a context on an unusable device is refused by name.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "model/config.h"
#include "model/model.h"
#include "test_util.h"

namespace moe::kernels {
namespace {

#define SKIP_WITHOUT_BF16() \
  if (!bf16_cpu_available()) GTEST_SKIP() << bf16_cpu_unavailable_reason()

using Vec = std::vector<float>;

// y = x · w^T for T rows of `in` into `out` (one GEMM on the calling thread's context).
Vec product(const Vec& x, const Vec& w, int T, int in, int out) {
  Vec y(static_cast<size_t>(T) * out);
  gemm(false, true, T, out, in, 1.0f, x.data(), 0, w.data(), 0, 0.0f, y.data(), 0);
  return y;
}

TEST(ExecContext, ScopesNestAndRestoreOnException) {
  ExecContext& outside = current_context();
  EXPECT_EQ(outside.device(), Device::kCpu);
  EXPECT_FALSE(outside.gemm_bf16());
  ExecContext a(Device::kCpu, true), b(Device::kCpu, false);
  {
    const ContextScope on_a(a);
    EXPECT_EQ(&current_context(), &a);
    EXPECT_TRUE(gemm_bf16());
    try {
      const ContextScope on_b(b);
      EXPECT_EQ(&current_context(), &b);
      throw std::runtime_error("leaves the scope");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(&current_context(), &a);
  }
  EXPECT_EQ(&current_context(), &outside);
  // Another thread starts on its own default context, not on this thread's scope.
  const ContextScope on_a(a);
  const ExecContext* seen = nullptr;
  std::thread([&] { seen = &current_context(); }).join();
  EXPECT_NE(seen, &a);
}

TEST(ExecContext, RefusesAnUnusableDeviceByFlag) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  const std::string msg = test_util::error_of([] { ExecContext gpu(Device::kCuda); });
  EXPECT_NE(msg.find("--device"), std::string::npos) << msg;
}

TEST(ExecContext, ContextsKeepTheirOwnWeightCopies) {
  SKIP_WITHOUT_BF16();
  const int T = 8, in = 32, out = 16;
  const Vec x = test_util::randn(T * in, 1, 0, 1.0), w = test_util::randn(out * in, 2, 0, 1.0);
  ExecContext a(Device::kCpu, true), b(Device::kCpu, true);
  const ContextScope on_a(a);
  const Vec per_gemm = product(x, w, T, in, out);
  const Bf16WeightScope copy(w.data(), w.size());  // a's copy
  const int64_t a_reads = bf16_weight_copy_reads();
  EXPECT_EQ(product(x, w, T, in, out), per_gemm);
  EXPECT_EQ(bf16_weight_copy_reads(), a_reads + 1);
  {
    const ContextScope on_b(b);
    EXPECT_EQ(product(x, w, T, in, out), per_gemm);
    EXPECT_EQ(bf16_weight_copy_reads(), 0) << "b read a's weight copy";
    const Bf16WeightScope b_copy(w.data(), w.size());  // b may open its own beside a's
    EXPECT_EQ(product(x, w, T, in, out), per_gemm);
    EXPECT_EQ(bf16_weight_copy_reads(), 1);
  }
}

// The MoE layer's shared experts beside the exchange (--comm.overlap) run on the worker: the
// weight copy of the step is read through, its own input scopes and scratch do not touch the
// parent's, and both threads computing at once give the bits of one thread after the other.
TEST(ExecContext, WorkerComputesBesideItsParentWithTheSameBits) {
  SKIP_WITHOUT_BF16();
  const int T = 24, in = 64, out = 48;
  const Vec x = test_util::randn(T * in, 3, 0, 1.0), w = test_util::randn(out * in, 4, 0, 1.0);
  const Vec x2 = test_util::randn(T * in, 5, 0, 1.0), w2 = test_util::randn(out * in, 6, 0, 1.0);
  ExecContext parent(Device::kCpu, true);
  const ContextScope on(parent);
  const Vec want = product(x, w, T, in, out), want2 = product(x2, w2, T, in, out);
  const Bf16WeightScope copy(w2.data(), w2.size());
  ExecContext& worker = parent.worker();
  EXPECT_EQ(worker.parent(), &parent);
  EXPECT_EQ(worker.device(), Device::kCpu);
  EXPECT_TRUE(worker.gemm_bf16());
  EXPECT_EQ(&parent.worker(), &worker) << "one worker per context";
  for (int round = 0; round < 20; ++round) {
    Vec got2;
    int64_t worker_reads = -1;
    std::thread beside([&] {
      const ContextScope on_worker(worker);
      got2 = product(x2, w2, T, in, out);  // w2 from the parent's copy
      worker_reads = bf16_weight_copy_reads();
    });
    Vec got;
    {
      const Bf16InputScope once(x.data(), x.size());  // the parent's input stack only
      got = product(x, w, T, in, out);
    }
    beside.join();
    ASSERT_EQ(got, want);
    ASSERT_EQ(got2, want2);
    ASSERT_EQ(worker_reads, round + 1) << "the worker did not read its parent's weight copy";
  }
}

TEST(ExecContext, ModelCarriesItsContext) {
  SKIP_WITHOUT_BF16();
  model::ModelConfig c = model::preset("test-moe");
  const int B = 2, T = 8;
  std::vector<int32_t> tokens(B * (T + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37) % c.vocab_size);
  ExecContext bf16(Device::kCpu, true);
  std::unique_ptr<model::Model> m;
  double inside = 0;
  {
    const ContextScope on(bf16);
    m = std::make_unique<model::Model>(c);
    m->init_weights(7);
    inside = m->evaluate(tokens.data(), B, T).total;
  }
  EXPECT_NE(&m->context(), &bf16) << "the model owns a context of its own";
  EXPECT_TRUE(m->context().gemm_bf16());
  EXPECT_EQ(m->evaluate(tokens.data(), B, T).total, inside) << "called outside the scope it was built in";
  model::Model fp32(c);
  fp32.init_weights(7);
  EXPECT_FALSE(fp32.context().gemm_bf16());
  EXPECT_NE(fp32.evaluate(tokens.data(), B, T).total, inside) << "bf16 rounding should show in the loss";
}

}  // namespace
}  // namespace moe::kernels
