// libFuzzer target: the Megatron indexed dataset reader (io/indexed_dataset.h) and the corpus
// over it (io/token_corpus.h, TokenCorpus::load, sample_batch, val_batches). Input: 4 parameter
// bytes (vocabulary: 1 << (8 + b0 % 9), capped at 65536; T = 1 + b1 % 64; B = 1 + b2 % 4; batches
// = 1 + b3 % 3), a u32 LE length n, then n bytes of PREFIX.idx and the rest as PREFIX.bin. A
// moe::Error is the expected answer to bad input; any other exception, a sanitizer report, a
// crash or a hang is a finding. Invariants checked on success: every sampled id is in [0, vocab),
// the splits hold the index's tokens, and at most one pass over the .bin is made per load (the
// token check is bounded by the .bin's size: sequences never overlap).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/indexed_dataset.h"
#include "io/token_corpus.h"

namespace {

// One folder per fuzzing process holding d.idx and d.bin, rewritten for each input.
struct Folder {
  Folder() {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir && *dir ? dir : "/tmp") + "/moetrain_fuzz_idx_XXXXXX";
    if (!::mkdtemp(path.data())) std::abort();
  }
  ~Folder() {
    ::unlink((path + "/d.idx").c_str());
    ::unlink((path + "/d.bin").c_str());
    ::rmdir(path.c_str());
  }
  void put(const std::string& name, const uint8_t* data, size_t size) const {
    FILE* f = std::fopen((path + "/" + name).c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
  }
  std::string path;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  static Folder folder;
  const int vocab = 1 << std::min(16, 8 + data[0] % 9);
  const int T = 1 + data[1] % 64, B = 1 + data[2] % 4, batches = 1 + data[3] % 3;
  uint32_t n = 0;
  std::memcpy(&n, data + 4, 4);
  const size_t rest = size - 8;
  n = static_cast<uint32_t>(std::min<size_t>(n, rest));
  folder.put("d.idx", data + 8, n);
  folder.put("d.bin", data + 8 + n, rest - n);
  const std::string prefix = folder.path + "/d";
  try {
    moe::io::TokenCorpus c = moe::io::TokenCorpus::load(prefix, vocab);
    const uint64_t total = c.num_tokens(moe::io::Split::kTrain) + c.num_tokens(moe::io::Split::kVal);
    if (total * moe::io::dtype_item_size(moe::io::read_index_header(prefix + ".idx").dtype_code) > rest - n)
      __builtin_trap();  // more tokens than the .bin holds: sequences overlapped
    const size_t len = static_cast<size_t>(T) + 1;
    for (moe::io::Split s : {moe::io::Split::kTrain, moe::io::Split::kVal}) {
      std::vector<int32_t> rows(static_cast<size_t>(B) * len);
      moe::Rng rng(size);
      try {
        c.sample_batch(rows.data(), B, T, rng, s);
        for (int32_t id : rows)
          if (id < 0 || id >= vocab) __builtin_trap();
      } catch (const moe::Error&) {
        if (c.num_windows(s, T) > 0) __builtin_trap();  // a window fits: sampling must succeed
      }
    }
    try {
      for (int32_t id : c.val_batches(B, T, batches))
        if (id < 0 || id >= vocab) __builtin_trap();
    } catch (const moe::Error&) {
      if (c.num_windows(moe::io::Split::kVal, T) > 0) __builtin_trap();
    }
    const double bpt = c.val_bytes_per_token();
    if (!(bpt >= 0.0)) __builtin_trap();
  } catch (const moe::Error&) {
  }
  return 0;
}
