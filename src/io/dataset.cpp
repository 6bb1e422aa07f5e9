// Byte-level text corpus: load, fixed split, window sampling (see dataset.h for the split rule).
#include "io/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/data_file.h"
#include "io/fingerprint.h"

namespace moe::io {

const char* split_name(Split s) { return s == Split::kTrain ? "train" : "val"; }

std::string ByteCorpus::tokenizer_fingerprint() const { return byte_tokenizer_fingerprint(); }

ByteCorpus ByteCorpus::load(const std::string& path, size_t block_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(str_cat("dataset ", path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(str_cat("dataset ", path, ": is a directory, expected a text file"));
  }
  ByteCorpus c;
  c.path_ = path;
  // A regular file is read up to the size it had when opened: one that grows while it is read
  // (a log still being written) is a snapshot, never a read that chases its writer forever. A
  // stream (a pipe, a device) has no size: it is read to EOF, but no further than kMaxStreamBytes.
  const bool regular = S_ISREG(st.st_mode);
  const size_t limit = regular ? static_cast<size_t>(st.st_size) : kMaxStreamBytes;
  if (regular && st.st_size > 0) c.bytes_.reserve(static_cast<size_t>(st.st_size));
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    if (c.bytes_.size() >= limit) {
      if (regular) break;  // the size it had when opened
      ::close(fd);
      throw Error(str_cat("dataset ", path, ": a stream of more than ", limit,
                          " bytes (it does not end); save the data to a file first"));
    }
    check_stop(str_cat("dataset ", path));  // a large file takes seconds
    const size_t want = std::min(chunk.size(), limit - c.bytes_.size());
    ssize_t r = ::read(fd, chunk.data(), want);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw Error(str_cat("dataset ", path, ": read failed: ", std::strerror(err)));
    }
    if (r == 0) break;
    c.bytes_.insert(c.bytes_.end(), chunk.begin(), chunk.begin() + r);
  }
  ::close(fd);
  MOE_CHECK(!c.bytes_.empty(), "dataset ", path, ": file is empty");
  c.identity_ = {path, c.bytes_.size(), hex16(sampled_fnv1a64(c.bytes_.data(), c.bytes_.size())),
                 regular ? st.st_mtim.tv_sec * int64_t{1000000000} + st.st_mtim.tv_nsec : 0};

  // Maximal runs of blocks of one split become segments.
  const size_t n = c.bytes_.size();
  if (block_bytes == 0) block_bytes = std::max<size_t>(256, std::min(kBlockBytes, n / 40));
  c.block_bytes_ = block_bytes;
  for (size_t b = 0; b * block_bytes < n; ++b) {
    size_t begin = b * block_bytes, end = std::min(n, begin + block_bytes);
    auto& segs = (b % kValEvery == kValEvery - 1) ? c.val_ : c.train_;
    if (!segs.empty() && segs.back().end == begin)
      segs.back().end = end;
    else
      segs.push_back({begin, end});
  }
  return c;
}

Split ByteCorpus::split_of_byte(size_t pos) const {
  return (pos / block_bytes_) % kValEvery == kValEvery - 1 ? Split::kVal : Split::kTrain;
}

size_t ByteCorpus::num_tokens(Split s) const {
  size_t total = 0;
  for (const auto& seg : segments(s)) total += seg.end - seg.begin;
  return total;
}

uint64_t ByteCorpus::num_windows(Split s, int T) const {
  MOE_CHECK(T > 0, "dataset ", path_, ": seq_len must be positive, got ", T);
  const size_t w = static_cast<size_t>(T) + 1;
  uint64_t total = 0;
  for (const auto& seg : segments(s))
    if (seg.end - seg.begin >= w) total += seg.end - seg.begin - w + 1;
  return total;
}

void ByteCorpus::check_windows(Split s, int T) const {
  if (num_windows(s, T) > 0) return;
  size_t longest = 0;
  for (const auto& seg : segments(s)) longest = std::max(longest, seg.end - seg.begin);
  throw Error(str_cat("dataset ", path_, ": the ", split_name(s), " split has no window of seq_len+1 = ",
                      T + 1, " bytes: its longest contiguous segment is ", longest,
                      " bytes (file ", bytes_.size(), " bytes in blocks of ", block_bytes_,
                      ", every ", kValEvery, "th block is validation)"));
}

size_t ByteCorpus::window_start(Split s, int T, uint64_t w) const {
  const size_t len = static_cast<size_t>(T) + 1;
  for (const auto& seg : segments(s)) {
    size_t size = seg.end - seg.begin;
    if (size < len) continue;
    uint64_t count = size - len + 1;
    if (w < count) return seg.begin + static_cast<size_t>(w);
    w -= count;
  }
  throw Error(str_cat("dataset ", path_, ": window index out of range (internal error)"));
}

void ByteCorpus::sample_batch(int32_t* tokens_B_T1, int B, int T, Rng& rng, Split split) const {
  MOE_CHECK(B > 0, "dataset ", path_, ": batch size must be positive, got ", B);
  check_windows(split, T);
  const uint64_t total = num_windows(split, T);
  const size_t len = static_cast<size_t>(T) + 1;
  // One below() per row, in row order: the batch is a function of the Rng state alone. The
  // segment search is linear in the number of segments (one per 20 blocks), cheap next to a step.
  for (int b = 0; b < B; ++b) {
    size_t start = window_start(split, T, rng.below(total));
    int32_t* row = tokens_B_T1 + static_cast<size_t>(b) * len;
    for (size_t t = 0; t < len; ++t) row[t] = bytes_[start + t];
  }
}

std::vector<int32_t> ByteCorpus::val_batches(int B, int T, int num_batches) const {
  MOE_CHECK(B > 0 && num_batches > 0, "dataset ", path_,
            ": val_batches needs positive B and num_batches, got ", B, " and ", num_batches);
  check_windows(Split::kVal, T);
  const uint64_t total = num_windows(Split::kVal, T);
  const uint64_t num_rows = static_cast<uint64_t>(B) * static_cast<uint64_t>(num_batches);
  const size_t len = static_cast<size_t>(T) + 1;
  std::vector<int32_t> out(num_rows * len);
  for (uint64_t i = 0; i < num_rows; ++i) {
    auto w = static_cast<uint64_t>(static_cast<unsigned __int128>(i) * total / num_rows);
    size_t start = window_start(Split::kVal, T, w);
    for (size_t t = 0; t < len; ++t) out[i * len + t] = bytes_[start + t];
  }
  return out;
}

}  // namespace moe::io
