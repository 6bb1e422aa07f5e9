// A tokenized dataset (Megatron indexed dataset, io/indexed_dataset.h) as training data: split by
// documents, windows drawn from the mmapped .bin, token ids checked against the model's vocabulary.
//
// Split rule: document d (0-based, in index order) is validation when d % 20 == 19, training
// otherwise. Each split is the concatenation of its documents in order (like Megatron's GPT
// dataset, which packs documents back to back); a window of T+1 tokens is any T+1 consecutive
// tokens of one split's concatenation, so it may span the end of one document and the start of
// the next of the same split, but never mixes splits. A dataset needs 20 documents or more to
// hold out anything.
//
// Sidecar PREFIX.tokenizer.json (written by moetrain tokenize; optional for datasets made by other
// tools): the tokenizer ("kind" bytes|spm, "model" the SentencePiece file beside the dataset,
// "vocab_size"), the document count and, per split, its tokens and the bytes of its source text.
// The trainer checks vocab_size against the model and reports the held-out loss in nats per byte
// = nats per token × tokens / bytes of the validation split.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/corpus.h"
#include "io/indexed_dataset.h"

namespace moe::io {

struct TokenizerInfo {
  std::string kind;       // "bytes" or "spm"
  std::string model;      // SentencePiece model file name, relative to the dataset's folder ("" for bytes)
  int vocab_size = 0;
  uint64_t documents = 0;
  uint64_t train_tokens = 0, train_bytes = 0, val_tokens = 0, val_bytes = 0;
};
std::string tokenizer_info_path(const std::string& prefix);  // PREFIX.tokenizer.json
// Every field checked, errors name it; read as a plain file beside the dataset (no symlink).
TokenizerInfo read_tokenizer_info(const std::string& path);
// Through io::write_file_atomic (io/output_file.h); errors name `flag` and the path.
void write_tokenizer_info(const std::string& path, const TokenizerInfo& info,
                          const std::string& flag = "tokenizer sidecar");

class TokenCorpus : public Corpus {
 public:
  static constexpr uint64_t kValEvery = 20;  // document d is validation iff d % 20 == 19
  static bool is_val_document(uint64_t d) { return d % kValEvery == kValEvery - 1; }

  // Opens PREFIX.{idx,bin} (and the sidecar when present) and scans every token once: an id < 0
  // or >= vocab_size (the model's) is an error naming the .bin, the token's position and byte
  // offset; the sidecar's vocab_size must not exceed the model's and its token counts must match
  // the index.
  static TokenCorpus load(const std::string& prefix, int vocab_size);

  void sample_batch(int32_t* tokens_B_T1, int B, int T, Rng& rng, Split split) const override;
  std::vector<int32_t> val_batches(int B, int T, int num_batches) const override;
  const std::string& path() const override { return prefix_; }
  double val_bytes_per_token() const override;
  std::string tokenizer_kind() const override { return has_info_ ? info_.kind : "unknown"; }

  uint64_t num_tokens(Split s) const { return (s == Split::kTrain ? train_ : val_).total; }
  uint64_t num_windows(Split s, int T) const;  // T+1 windows of the split (0 if none fits)
  bool has_tokenizer_info() const { return has_info_; }
  const TokenizerInfo& tokenizer_info() const { return info_; }

  // Bytes of the tables load() builds, from the index's header alone (for the memory estimate).
  static double resident_bytes(const std::string& prefix);

 private:
  // A run of tokens contiguous in the .bin that belongs to one split: tokens [bin_token,
  // bin_token + length) of the .bin are tokens [start, start + length) of the split's stream.
  struct Piece {
    uint64_t start, bin_token, length;
  };
  struct Stream {
    std::vector<Piece> pieces;
    uint64_t total = 0;
  };
  const Stream& stream(Split s) const { return s == Split::kTrain ? train_ : val_; }
  void check_windows(Split s, int T) const;
  void copy_window(const Stream& st, uint64_t start, uint64_t len, int32_t* out) const;

  std::string prefix_;
  IndexedDataset data_;
  Stream train_, val_;
  bool has_info_ = false;
  TokenizerInfo info_;
};

}  // namespace moe::io
