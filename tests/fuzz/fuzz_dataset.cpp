// libFuzzer target: ByteCorpus::load of a file, then sample_batch (both splits) and val_batches
// with small sizes. The first 4 input bytes choose the sizes (block bytes, T, B, batches); the
// rest is the file. A moe::Error is the expected answer to bad input (an empty file, no window
// that fits); any other exception, a sanitizer report or a crash is a finding. Every sampled row
// must be T+1 consecutive bytes of the file lying inside one split.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "fuzz_input_file.h"
#include "io/dataset.h"

namespace {

// Whether row (T+1 tokens) equals the file bytes at some start inside split s.
bool row_in_split(const moe::io::ByteCorpus& c, const std::vector<uint8_t>& file, const int32_t* row,
                  int T, moe::io::Split s) {
  const size_t len = static_cast<size_t>(T) + 1;
  for (const auto& seg : c.segments(s)) {
    for (size_t p = seg.begin; p + len <= seg.end; ++p) {
      size_t t = 0;
      while (t < len && row[t] == file[p + t]) ++t;
      if (t == len) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t block_bytes = data[0] % 4 == 0 ? 0 : data[0];  // 0: the default rule
  const int T = 1 + data[1] % 64;
  const int B = 1 + data[2] % 4;
  const int num_batches = 1 + data[3] % 3;
  const std::vector<uint8_t> file(data + 4, data + size);
  const std::string& path = moe::fuzz::input_file().write(file.data(), file.size());
  try {
    moe::io::ByteCorpus c = moe::io::ByteCorpus::load(path, block_bytes);
    if (c.size_bytes() != file.size()) __builtin_trap();
    if (c.num_tokens(moe::io::Split::kTrain) + c.num_tokens(moe::io::Split::kVal) != file.size())
      __builtin_trap();
    const size_t len = static_cast<size_t>(T) + 1;
    for (moe::io::Split s : {moe::io::Split::kTrain, moe::io::Split::kVal}) {
      std::vector<int32_t> tokens(static_cast<size_t>(B) * len);
      moe::Rng rng(size);
      try {
        c.sample_batch(tokens.data(), B, T, rng, s);
      } catch (const moe::Error&) {
        if (c.num_windows(s, T) != 0) __builtin_trap();  // refused although a window fits
        continue;
      }
      for (int b = 0; b < B; ++b)
        if (!row_in_split(c, file, tokens.data() + b * len, T, s)) __builtin_trap();
    }
    std::vector<int32_t> val = c.val_batches(B, T, num_batches);
    if (val.size() != static_cast<size_t>(num_batches) * B * len) __builtin_trap();
    for (size_t r = 0; r < val.size() / len; ++r)
      if (!row_in_split(c, file, val.data() + r * len, T, moe::io::Split::kVal)) __builtin_trap();
  } catch (const moe::Error&) {
  }
  return 0;
}
