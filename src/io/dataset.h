// The built-in dataset: a raw text file read as bytes (tokens 0..255, vocab 256), with a fixed
// train/validation split and batch sampling that depends only on an Rng's state (so a checkpoint's
// data cursor is just that state).
//
// Split rule: the file is cut into blocks of 64 KiB (kBlockBytes); block b is validation when
// b % 20 == 19 and training otherwise, so 1/20 of the data (of every complete group of 20 blocks)
// is held out, whatever the file's length. Consecutive blocks of one split form a segment; a
// window of T+1 tokens always lies inside one segment, so it never crosses between splits and never
// spans the seam where a held-out block was removed. A file shorter than 20 blocks (1.25 MiB)
// has no validation data at the default block size; load() takes a smaller block size for those.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/corpus.h"

namespace moe::io {

class ByteCorpus : public Corpus {
 public:
  static constexpr size_t kBlockBytes = 64 * 1024;
  // A stream (not a regular file) is read to EOF but no further than this (16 GiB).
  static constexpr size_t kMaxStreamBytes = size_t{16} << 30;
  static constexpr size_t kValEvery = 20;  // block b is validation iff b % kValEvery == kValEvery-1
  static constexpr int kVocabSize = 256;

  // Reads the whole file. Throws moe::Error naming the path: missing or unreadable (with the OS
  // reason), a directory, or empty. block_bytes = 0 picks min(64 KiB, size/40) (at least 256), so
  // a file smaller than 20 full blocks still gets about 1/20 of its bytes held out in 2+ blocks.
  static ByteCorpus load(const std::string& path, size_t block_bytes = 0);

  // Fills tokens_B_T1 (B rows of T+1 consecutive tokens, row-major) with windows drawn uniformly
  // over every start position of the split whose window fits inside one segment: one rng.below()
  // call per row. inputs = row[0..T), targets = row[1..T]. Throws (naming the path, T+1 and the
  // longest segment) if the split has no such window.
  void sample_batch(int32_t* tokens_B_T1, int B, int T, Rng& rng, Split split) const override;

  // Fixed evaluation windows: num_batches * B windows of T+1 tokens, evenly spaced over the
  // validation split's start positions (window i starts at position floor(i * U / W) of U valid
  // starts, W windows), laid out [num_batches, B, T+1]. Same file and arguments -> same tokens.
  std::vector<int32_t> val_batches(int B, int T, int num_batches) const override;

  const std::string& path() const override { return path_; }
  double val_bytes_per_token() const override { return 1.0; }  // a byte is a token
  std::string tokenizer_kind() const override { return "bytes"; }
  std::string tokenizer_fingerprint() const override;  // the byte tokenizer's
  Identity identity() const override { return identity_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t size_bytes() const { return bytes_.size(); }
  size_t num_tokens(Split s) const;  // bytes in the split
  // Number of distinct window starts of T+1 tokens in the split (0 if none fits).
  uint64_t num_windows(Split s, int T) const;

  struct Segment {
    size_t begin, end;  // byte range [begin, end) of the file
  };
  const std::vector<Segment>& segments(Split s) const {
    return s == Split::kTrain ? train_ : val_;
  }
  Split split_of_byte(size_t pos) const;  // which split the byte at pos belongs to

 private:
  // Byte position of the window with index w in [0, num_windows(s, T)) (segments in file order).
  size_t window_start(Split s, int T, uint64_t w) const;
  void check_windows(Split s, int T) const;

  std::string path_;
  size_t block_bytes_ = kBlockBytes;
  std::vector<uint8_t> bytes_;
  std::vector<Segment> train_, val_;
  Identity identity_;
};

}  // namespace moe::io
