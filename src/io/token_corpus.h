// A tokenized dataset (Megatron indexed dataset, io/indexed_dataset.h) as training data: split by
// documents, windows read from the .bin (pread), token ids checked against the model's vocabulary.
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
// = nats per token × bytes-per-token of the validation split. That figure is recomputed from the
// tokens (issue 42, class 4): a byte tokenizer's token is one byte; a SentencePiece token is as
// many bytes as its piece decodes to, read from the model file beside the dataset; a sidecar whose
// byte counts disagree is refused; without the model file the bytes are unknown (nats per token
// only), never taken from the sidecar alone.
//
// Tokenizer identity (issue 42, class 4): "fingerprint" = tokenizer_fingerprint(kind, vocab,
// model file bytes), "<kind>-<vocab>-<16 hex digits>". tokenize writes it in the sidecar; a
// trained model carries it in its config (moetrain_tokenizer_fingerprint: checkpoints, exports,
// train's --out), and train --resume, eval and generate refuse a mismatch naming both. Files
// written before fingerprints existed: when either side has none, nothing is compared (one line
// says so) - there is nothing to compare against; a byte-level sidecar without one is known
// anyway (the byte tokenizer has no model file).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/corpus.h"
#include "io/fingerprint.h"
#include "io/indexed_dataset.h"

namespace moe::io {

struct TokenizerInfo {
  std::string kind;   // "bytes" or "spm"
  std::string model;  // SentencePiece model file name, relative to the dataset's folder ("" for bytes)
  int vocab_size = 0;
  std::string fingerprint;  // "" in sidecars written before fingerprints
  uint64_t documents = 0;
  uint64_t train_tokens = 0, train_bytes = 0, val_tokens = 0, val_bytes = 0;
};
std::string tokenizer_info_path(const std::string& prefix);  // PREFIX.tokenizer.json

// The bytes each id of a SentencePiece model decodes to (its ModelProto read directly: normal and
// user pieces their text with U+2581 as one space, byte pieces 1, control and unknown pieces 0).
// Errors name `path`.
std::vector<uint32_t> spm_piece_bytes(std::string_view model_bytes, const std::string& path);
// Every field checked, errors name it; read as a plain file beside the dataset (no symlink).
TokenizerInfo read_tokenizer_info(const std::string& path);
// The sidecar's text.
std::string tokenizer_info_json(const TokenizerInfo& info);
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
  std::string tokenizer_fingerprint() const override { return fingerprint_; }
  Identity identity() const override { return identity_; }

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
  std::string fingerprint_;
  Identity identity_;
  double val_bytes_per_token_ = 0;  // recomputed from the tokens (0: unknown)
};

}  // namespace moe::io
