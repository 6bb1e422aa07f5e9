// The data a run trains on, behind one interface: the byte-level text file (io/dataset.h,
// ByteCorpus) or a Megatron-style indexed dataset of token ids (io/token_corpus.h, TokenCorpus).
// Both split their data once into training and validation by a fixed rule, draw training windows
// from an Rng's state alone (so a checkpoint's data cursor is that state), and give fixed
// validation windows.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/fingerprint.h"

namespace moe::io {

enum class Split {
  kTrain,
  kVal
};
const char* split_name(Split s);  // "train" / "val"

class Corpus {
 public:
  virtual ~Corpus() = default;
  // Fills tokens_B_T1 (B rows of T+1 consecutive tokens of one split, row-major) with windows
  // drawn uniformly over the split's valid start positions: one rng.below() call per row.
  virtual void sample_batch(int32_t* tokens_B_T1, int B, int T, Rng& rng, Split split) const = 0;
  // num_batches * B fixed, evenly spaced validation windows of T+1 tokens, [num_batches, B, T+1].
  virtual std::vector<int32_t> val_batches(int B, int T, int num_batches) const = 0;
  virtual const std::string& path() const = 0;
  // Bytes of source text per token in the validation split: 1 for byte-level text; 0 when the
  // dataset does not say (an indexed dataset without moetrain's tokenizer sidecar). A loss in
  // nats per token divided by this is in nats per byte, comparable across tokenizers.
  virtual double val_bytes_per_token() const = 0;
  // "bytes" for a text file, otherwise what the tokenizer sidecar names ("bytes", "spm", or
  // "unknown" without a sidecar).
  virtual std::string tokenizer_kind() const = 0;
  // The tokenizer's identity (io/token_corpus.h, tokenizer_fingerprint): the byte fingerprint for
  // a text file; for an indexed dataset the sidecar's (checked against the model file beside it),
  // or "" when nothing says which tokenizer made the ids (an old sidecar or none).
  virtual std::string tokenizer_fingerprint() const = 0;
  // What the data is, recorded in a checkpoint and compared at resume (issue 42, class 5): a file
  // replaced by another, even of the same size, is then refused by name.
  struct Identity {
    std::string file;      // the file the tokens come from (text file or PREFIX.bin)
    uint64_t bytes = 0;    // its size (for an indexed dataset, .bin and .idx together)
    std::string sample;    // FNV-1a 64 (16 hex digits) of sampled blocks of its files
    int64_t mtime_ns = 0;  // its modification time (the latest of the .bin and .idx)
  };
  virtual Identity identity() const = 0;
};


// --data names an indexed dataset when it ends in .idx or .bin, or when it is not a file but
// PATH.idx is; otherwise it is a text file. indexed_prefix strips a .idx / .bin ending.
bool is_indexed_dataset(const std::string& path);
std::string indexed_prefix(const std::string& path);

// Opens either kind. vocab_size: the model's; every token id of an indexed dataset is checked
// against it (and against the tokenizer's vocabulary when the sidecar names one) at load.
std::unique_ptr<Corpus> open_corpus(const std::string& path, int vocab_size);

// Bytes the loader keeps in this process's memory, for the run's memory estimate: the whole
// file for text (it is read into memory); for an indexed dataset only its per-sequence tables
// (the .idx is mmapped, the .bin read per window with pread: reclaimable page cache, not counted).
double corpus_resident_bytes(const std::string& path);

}  // namespace moe::io
