// moetrain tokenize: text files -> a Megatron indexed dataset (PREFIX.bin, PREFIX.idx) plus the
// tokenizer sidecar PREFIX.tokenizer.json (and PREFIX.model for SentencePiece), see
// io/indexed_dataset.h and io/token_corpus.h.
//
// Documents: --docs paragraph (default) ends a document after a run of blank lines (the blank
// lines belong to it: for the KJV corpus a document is a chapter), --docs line makes every line a
// document, --docs file every input file. The end of a file always ends a document. Each document
// is one sequence; the concatenation of all documents is exactly the input, so with a lossless
// tokenizer the bytes of each split are known exactly (the sidecar records them).
// A BPE (--tokenizer bpe:N) is trained on the training documents only (d % 20 != 19), so the
// held-out text is unseen by the tokenizer as by the model. Every document is checked to decode
// back to its text; a tokenizer that does not (a lossy spm model) is refused, since nats per byte
// would then be wrong.
// The dataset is one unit (issue 42, class 3): .bin, .idx, the SentencePiece model and the
// sidecar are written under temporary names and renamed into place together only once all are
// complete; a failure leaves an existing dataset, its model included, as it was. The CLI also
// holds PREFIX.lock (a second tokenize onto the prefix is refused naming the first one's pid) and
// removes the temporary files on SIGTERM/SIGINT.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe::text {

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string tokenizer = "bytes";  // bytes | bpe:N | spm:PATH
  std::string output;               // PREFIX (a trailing .bin / .idx is dropped)
  std::string docs = "paragraph";   // paragraph | line | file
  bool progress = true;
};

struct TokenizeResult {
  std::string prefix;
  uint64_t documents = 0, tokens = 0, bytes = 0, val_tokens = 0, val_bytes = 0;
  int vocab_size = 0;
  std::string model_path;   // SentencePiece model beside the dataset ("" for bytes)
  std::string fingerprint;  // io::tokenizer_fingerprint of the tokenizer (in the sidecar)
};

TokenizeResult run_tokenize(const TokenizeOptions& opts);

}  // namespace moe::text
