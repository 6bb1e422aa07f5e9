// libFuzzer target: the tokenizer sidecar PREFIX.tokenizer.json (io/token_corpus.h,
// read_tokenizer_info) and the SentencePiece model reader that recomputes bytes per token
// (spm_piece_bytes, a protobuf walk). Input: first byte 0 = the bytes are a sidecar, 1 = a model
// file, 2 = a sidecar beside a real two-document dataset (TokenCorpus::load checks it against the
// index and the tokens). A moe::Error is the expected answer to bad input; anything else is a
// finding. A sidecar that reads back is written again (tokenizer_info_json) and must read back
// equal.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_input_file.h"
#include "io/indexed_dataset.h"
#include "io/token_corpus.h"

namespace {

bool same(const moe::io::TokenizerInfo& a, const moe::io::TokenizerInfo& b) {
  return a.kind == b.kind && a.model == b.model && a.vocab_size == b.vocab_size && a.fingerprint == b.fingerprint &&
         a.documents == b.documents && a.train_tokens == b.train_tokens && a.train_bytes == b.train_bytes &&
         a.val_tokens == b.val_tokens && a.val_bytes == b.val_bytes;
}

// A folder with a 20-document byte dataset (d.idx, d.bin), made once per process.
const std::string& dataset_prefix() {
  static const std::string prefix = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string path = std::string(dir && *dir ? dir : "/tmp") + "/moetrain_fuzz_side_XXXXXX";
    if (!::mkdtemp(path.data())) std::abort();
    moe::io::IndexedDatasetWriter w(path + "/d", 1);
    const std::vector<int32_t> doc = {'a', 'b', 'c', '\n'};
    for (int d = 0; d < 20; ++d) w.add_document(doc.data(), doc.size());
    w.finish();
    return path + "/d";
  }();
  return prefix;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (mode == 1) {
      const std::vector<uint32_t> pieces = moe::io::spm_piece_bytes(body, "fuzz.model");
      if (pieces.empty()) __builtin_trap();
      for (uint32_t b : pieces)
        if (b > body.size()) __builtin_trap();  // a piece decodes to at most its own bytes
      return 0;
    }
    std::string path;
    if (mode == 0) {
      path = moe::fuzz::input_file().write(data + 1, size - 1);
    } else {
      path = moe::io::tokenizer_info_path(dataset_prefix());
      FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) std::abort();
      if (size > 1 && std::fwrite(data + 1, 1, size - 1, f) != size - 1) std::abort();
      std::fclose(f);
    }
    const moe::io::TokenizerInfo t = moe::io::read_tokenizer_info(path);
    if (t.kind != "bytes" && t.kind != "spm") __builtin_trap();
    if (t.vocab_size < 1) __builtin_trap();
    if (!t.fingerprint.empty() && !moe::io::is_tokenizer_fingerprint(t.fingerprint)) __builtin_trap();
    const std::string again = moe::io::tokenizer_info_json(t);
    const std::string& p2 = moe::fuzz::input_file().write(reinterpret_cast<const uint8_t*>(again.data()), again.size());
    if (!same(moe::io::read_tokenizer_info(p2), t)) __builtin_trap();
    if (mode == 2) {
      moe::io::TokenCorpus c = moe::io::TokenCorpus::load(dataset_prefix(), 256);
      // Loaded: the sidecar describes exactly this dataset, and bytes per token come from the tokens.
      if (c.tokenizer_info().documents != 20) __builtin_trap();
      if (c.val_bytes_per_token() != 0.0 && c.val_bytes_per_token() != 1.0) __builtin_trap();
    }
  } catch (const moe::Error&) {
  }
  return 0;
}
