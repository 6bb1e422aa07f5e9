// The modes' vocabulary (core/modes.h): every word parses to its value and back, an unknown word
// is one error naming the flag, the word and the accepted words, and "auto" is std::nullopt.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "core/error.h"
#include "core/modes.h"
#include "test_util.h"

namespace moe {
namespace {

using test_util::error_of;

template <class E>
void expect_round_trip(std::initializer_list<E> values) {
  for (E v : values) {
    EXPECT_EQ(parse_mode<E>(name(v), "--x"), v) << name(v);
    EXPECT_EQ(find_mode<E>(name(v)), v) << name(v);
    std::ostringstream os;
    os << v;
    EXPECT_EQ(os.str(), name(v));
  }
}

TEST(Modes, EveryWordParsesToItsValueAndBack) {
  expect_round_trip({Device::kCpu, Device::kCuda});
  expect_round_trip({Precision::kFp32, Precision::kBf16});
  expect_round_trip({A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo});
  expect_round_trip({Schedule::k1F1B, Schedule::kGPipe});
  expect_round_trip({Recompute::kNone, Recompute::kMoe, Recompute::kFull});
  expect_round_trip({CommBackend::kMpi, CommBackend::kNccl});
  expect_round_trip({NodeKind::kGpu, NodeKind::kCpu});
  // The words the flags, layout strings and profiles have always printed.
  EXPECT_STREQ(name(A2a::kRbdHalo), "rbd-halo");
  EXPECT_STREQ(name(Schedule::k1F1B), "1f1b");
  EXPECT_STREQ(name(NodeKind::kGpu), "gpu");
}

TEST(Modes, UnknownWordsNameTheFlagTheWordAndTheAcceptedWords) {
  EXPECT_EQ(error_of([] { parse_a2a("ring", "--a2a"); }),
            "--a2a: unknown all-to-all algorithm 'ring' (expected flat, rbd, halo or rbd-halo)");
  EXPECT_EQ(error_of([] { parse_a2a_or_auto("ring", "--a2a"); }),
            "--a2a: unknown all-to-all algorithm 'ring' (expected flat, rbd, halo, rbd-halo or auto)");
  EXPECT_EQ(error_of([] { parse_device("tpu", "--device"); }), "--device: unknown device 'tpu' (expected cpu or cuda)");
  EXPECT_EQ(error_of([] { parse_schedule("", "--pp.schedule"); }),
            "--pp.schedule: unknown pipeline schedule '' (expected 1f1b or gpipe)");
  EXPECT_EQ(error_of([] { parse_precision("FP32", "--precision"); }),
            "--precision: unknown precision 'FP32' (expected fp32 or bf16)");  // words are case-sensitive
  EXPECT_EQ(error_of([] { parse_precision("auto", "--precision"); }),
            "--precision: unknown precision 'auto' (expected fp32 or bf16)");  // auto only where a flag takes it
  EXPECT_EQ(accepted_names<Recompute>(), "none, moe or full");
  EXPECT_EQ(find_mode<CommBackend>("gloo"), std::nullopt);
}

TEST(Modes, AutoIsNullopt) {
  EXPECT_EQ(parse_precision_or_auto("auto", "--precision"), std::nullopt);
  EXPECT_EQ(parse_precision_or_auto("bf16", "--precision"), Precision::kBf16);
  EXPECT_EQ(parse_comm_backend_or_auto("auto", "--comm.backend"), std::nullopt);
  EXPECT_EQ(parse_a2a_or_auto("halo", "--a2a"), A2a::kHalo);
  EXPECT_STREQ(name_or_auto(std::optional<A2a>()), "auto");
  EXPECT_STREQ(name_or_auto(std::optional<A2a>(A2a::kRbd)), "rbd");
}

}  // namespace
}  // namespace moe
