// Byte corpus: the fixed 1-in-20 block split, windows that never leave one segment, determinism from
// the Rng state alone, fixed validation windows, and errors that name the file.
//
// The test files encode where each byte came from: a training byte at file position p is p % 128,
// a validation byte is 128 + p % 128. A window is then "inside one split" when all its tokens are on
// one side of 128, and "contiguous in the file" when each token is the previous one + 1 (mod 128);
// block sizes are multiples of 128, so a window that jumped over a held-out block would repeat a
// value instead of incrementing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/dataset.h"

namespace {

namespace fs = std::filesystem;
using moe::Rng;
using moe::io::ByteCorpus;
using moe::io::Split;

std::string fresh_dir(const std::string& name) { return moe::test_util::fresh_scratch_dir("ds", name); }

// Writes n bytes following the encoding above for the given block size.
std::string write_marked(const std::string& path, size_t n, size_t block) {
  std::string s(n, '\0');
  for (size_t p = 0; p < n; ++p) {
    bool val = (p / block) % 20 == 19;
    s[p] = static_cast<char>((val ? 128 : 0) + p % 128);
  }
  std::ofstream(path, std::ios::binary).write(s.data(), static_cast<std::streamsize>(n));
  return path;
}

// Every row of a [rows, T+1] batch lies inside the split and is contiguous in the file.
void expect_windows_in_split(const std::vector<int32_t>& tok, int rows, int T, Split split) {
  for (int r = 0; r < rows; ++r) {
    const int32_t* row = tok.data() + static_cast<size_t>(r) * (T + 1);
    for (int t = 0; t <= T; ++t) {
      ASSERT_GE(row[t], 0);
      ASSERT_LT(row[t], 256);
      ASSERT_EQ(row[t] >= 128, split == Split::kVal) << "row " << r << " token " << t;
      if (t > 0) {
        ASSERT_EQ(row[t] % 128, (row[t - 1] + 1) % 128) << "row " << r << " token " << t;
      }
    }
  }
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const moe::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace

TEST(ByteCorpus, SplitRuleDefaultBlocks) {
  // 41.5 blocks of 64 KiB: blocks 19 and 39 are validation.
  std::string dir = fresh_dir("split64k");
  const size_t kB = ByteCorpus::kBlockBytes;
  const size_t n = 41 * kB + kB / 2;
  ByteCorpus c = ByteCorpus::load(write_marked(dir + "/d.txt", n, kB));
  EXPECT_EQ(c.size_bytes(), n);
  ASSERT_EQ(c.segments(Split::kVal).size(), 2u);
  EXPECT_EQ(c.segments(Split::kVal)[0].begin, 19 * kB);
  EXPECT_EQ(c.segments(Split::kVal)[0].end, 20 * kB);
  EXPECT_EQ(c.segments(Split::kVal)[1].begin, 39 * kB);
  EXPECT_EQ(c.segments(Split::kVal)[1].end, 40 * kB);
  ASSERT_EQ(c.segments(Split::kTrain).size(), 3u);
  EXPECT_EQ(c.segments(Split::kTrain)[0].begin, 0u);
  EXPECT_EQ(c.segments(Split::kTrain)[0].end, 19 * kB);
  EXPECT_EQ(c.segments(Split::kTrain)[1].begin, 20 * kB);
  EXPECT_EQ(c.segments(Split::kTrain)[2].end, n);
  EXPECT_EQ(c.num_tokens(Split::kVal), 2 * kB);
  EXPECT_EQ(c.num_tokens(Split::kTrain) + c.num_tokens(Split::kVal), n);
  for (size_t p : {size_t{0}, 19 * kB - 1, 19 * kB, 20 * kB - 1, 20 * kB, 39 * kB + 5, n - 1})
    EXPECT_EQ(c.split_of_byte(p), ((p / kB) % 20 == 19) ? Split::kVal : Split::kTrain) << p;
  // Window counts: a segment of L bytes has L - T starts for windows of T+1.
  EXPECT_EQ(c.num_windows(Split::kVal, 1023), 2 * (kB - 1023));
  fs::remove_all(dir);
}

TEST(ByteCorpus, WindowsStayInsideOneSegment) {
  // Small blocks (256 bytes) so windows of 65 often sit near segment ends.
  std::string dir = fresh_dir("inside");
  const size_t block = 256, n = 45 * block + 100;
  ByteCorpus c = ByteCorpus::load(write_marked(dir + "/d.txt", n, block), block);
  const int B = 64, T = 64;
  Rng rng(7);
  std::vector<int32_t> tok(static_cast<size_t>(B) * (T + 1));
  std::set<int32_t> first_tokens;
  for (Split s : {Split::kTrain, Split::kVal}) {
    for (int it = 0; it < 50; ++it) {
      c.sample_batch(tok.data(), B, T, rng, s);
      expect_windows_in_split(tok, B, T, s);
      if (s == Split::kVal)
        for (int b = 0; b < B; ++b) first_tokens.insert(tok[static_cast<size_t>(b) * (T + 1)]);
    }
  }
  // Val segments are [19*256, 20*256) and [39*256, 40*256): 2 * (256 - 64) = 384 starts; their first
  // tokens are 128 + p % 128 for p in each segment's first 192 positions, i.e. all 128 values.
  EXPECT_EQ(c.num_windows(Split::kVal, T), 384u);
  EXPECT_EQ(first_tokens.size(), 128u);
  // A window exactly as long as a val segment still fits (one start per segment).
  EXPECT_EQ(c.num_windows(Split::kVal, 255), 2u);
  c.sample_batch(tok.data(), 1, 255, rng, Split::kVal);
  EXPECT_EQ(tok[0], 128 + (19 * 256) % 128);
  fs::remove_all(dir);
}

TEST(ByteCorpus, SamplingDependsOnlyOnRngState) {
  std::string dir = fresh_dir("determinism");
  ByteCorpus c = ByteCorpus::load(write_marked(dir + "/d.txt", 30000, 512), 512);
  const int B = 4, T = 32;
  std::vector<int32_t> a(B * (T + 1)), b(B * (T + 1));
  Rng r1(123), r2(123);
  for (int i = 0; i < 5; ++i) {
    c.sample_batch(a.data(), B, T, r1, Split::kTrain);
    c.sample_batch(b.data(), B, T, r2, Split::kTrain);
    EXPECT_EQ(a, b);
  }
  // Save the cursor, draw, restore, draw again: the same batch (what a checkpoint resume does).
  uint64_t cursor = r1.state();
  c.sample_batch(a.data(), B, T, r1, Split::kTrain);
  Rng r3(999);
  r3.set_state(cursor);
  c.sample_batch(b.data(), B, T, r3, Split::kTrain);
  EXPECT_EQ(a, b);
  // One below() per row: the Rng advanced by exactly B draws.
  Rng r4(0);
  r4.set_state(cursor);
  for (int i = 0; i < B; ++i) r4.next_u64();
  EXPECT_EQ(r4.state(), r1.state());
  // A reloaded corpus gives the same batches.
  ByteCorpus c2 = ByteCorpus::load(dir + "/d.txt", 512);
  Rng r5(123), r6(123);
  c.sample_batch(a.data(), B, T, r5, Split::kVal);
  c2.sample_batch(b.data(), B, T, r6, Split::kVal);
  EXPECT_EQ(a, b);
  // Different seeds give different batches.
  Rng r7(124), r8(125);
  c.sample_batch(a.data(), B, T, r7, Split::kTrain);
  c.sample_batch(b.data(), B, T, r8, Split::kTrain);
  EXPECT_NE(a, b);
  fs::remove_all(dir);
}

TEST(ByteCorpus, FixedValidationBatches) {
  std::string dir = fresh_dir("valbatches");
  const size_t block = 512;
  ByteCorpus c = ByteCorpus::load(write_marked(dir + "/d.txt", 60 * block, block), block);
  const int B = 3, T = 20, nb = 4;
  std::vector<int32_t> v1 = c.val_batches(B, T, nb);
  std::vector<int32_t> v2 = c.val_batches(B, T, nb);
  ASSERT_EQ(v1.size(), static_cast<size_t>(nb * B * (T + 1)));
  EXPECT_EQ(v1, v2);
  expect_windows_in_split(v1, nb * B, T, Split::kVal);
  // Evenly spaced: window i starts at start index floor(i * U / 12) of the U = 3 * (512 - 20) val
  // starts; window 0 is the first byte of the first val block, window 4 starts at index 492, which
  // is the first byte of the second val block [39*512, 40*512).
  EXPECT_EQ(v1[0], 128 + (19 * 512) % 128);
  EXPECT_EQ(v1[4 * (T + 1)], 128 + (39 * 512) % 128);
  // Unaffected by any Rng: a fresh corpus object gives the same windows.
  EXPECT_EQ(ByteCorpus::load(dir + "/d.txt", block).val_batches(B, T, nb), v1);
  fs::remove_all(dir);
}

TEST(ByteCorpus, ErrorsNameTheFile) {
  std::string dir = fresh_dir("errors");
  const std::string missing = dir + "/missing.txt";
  expect_error([&] { ByteCorpus::load(missing); }, {missing, "No such file"});
  expect_error([&] { ByteCorpus::load(dir); }, {dir, "directory"});

  const std::string empty = dir + "/empty.txt";
  std::ofstream(empty).close();
  expect_error([&] { ByteCorpus::load(empty); }, {empty, "empty"});

  if (::geteuid() != 0) {  // root reads files whatever their mode
    const std::string locked = dir + "/locked.txt";
    std::ofstream(locked) << "hello";
    ::chmod(locked.c_str(), 0);
    expect_error([&] { ByteCorpus::load(locked); }, {locked, "Permission denied"});
  }

  // 10 KB in 64 KiB blocks: all training, no validation block at all.
  const std::string small = dir + "/small.txt";
  std::ofstream(small) << std::string(10000, 'x');
  ByteCorpus c = ByteCorpus::load(small, ByteCorpus::kBlockBytes);
  std::vector<int32_t> tok(2 * 17);
  Rng rng(1);
  EXPECT_NO_THROW(c.sample_batch(tok.data(), 2, 16, rng, Split::kTrain));
  expect_error([&] { c.sample_batch(tok.data(), 2, 16, rng, Split::kVal); },
               {small, "val split", "seq_len+1 = 17", "longest contiguous segment is 0"});
  expect_error([&] { c.val_batches(2, 16, 1); }, {small, "val split"});
  // Training window longer than the file.
  std::vector<int32_t> big(20001);
  expect_error([&] { c.sample_batch(big.data(), 1, 20000, rng, Split::kTrain); },
               {small, "train split", "seq_len+1 = 20001", "10000 bytes"});
  fs::remove_all(dir);
}

// A file smaller than 20 full blocks gets smaller blocks (size/40, at least 256 bytes), so about
// 1/20 of it is still held out for validation.
TEST(ByteCorpus, SmallFilesStillGetAValidationSplit) {
  const std::string dir = fresh_dir("small_corpus");
  const std::string path = dir + "/small.txt";
  std::ofstream(path) << std::string(100000, 'y');
  ByteCorpus c = ByteCorpus::load(path);
  EXPECT_EQ(c.block_bytes(), 2500u);
  EXPECT_EQ(c.num_tokens(Split::kVal), 5000u);
  EXPECT_EQ(c.num_tokens(Split::kTrain), 95000u);
}

// A file that grows while it is read (a writer appending as fast as it can) is read up to the
// size it had when opened: the load ends, instead of chasing the writer forever.
TEST(ByteCorpus, GrowingFileIsReadAsASnapshot) {
  const std::string path = fresh_dir("growing") + "/data.txt";
  const size_t initial = 4 << 20;
  write_marked(path, initial, 64);
  std::atomic<bool> stop{false};
  std::atomic<size_t> appended{0};
  std::thread writer([&] {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    const std::string chunk(1 << 20, 'x');
    while (!stop.load()) {
      f.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      f.flush();
      appended += chunk.size();
      if (appended.load() > (size_t{256} << 20)) break;  // bounded, whatever happens
    }
  });
  // Let the writer start, then load while it keeps appending.
  while (appended.load() == 0) std::this_thread::yield();
  const size_t at_open = fs::file_size(path);
  ByteCorpus c = ByteCorpus::load(path, 64);
  const size_t after = fs::file_size(path);
  stop = true;
  writer.join();
  EXPECT_GE(c.size_bytes(), at_open);
  EXPECT_LE(c.size_bytes(), after);
  EXPECT_GE(c.size_bytes(), initial);
}
