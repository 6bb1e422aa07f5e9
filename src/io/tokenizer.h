// Text <-> token ids for `moetrain generate`, behind one small interface. Byte-level is the only
// tokenizer today (one token per byte, ids 0..255, what the built-in corpus trains on); another
// (e.g. SentencePiece for tokenized datasets) implements the same three functions.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/fingerprint.h"

namespace moe::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // The text of one token id (ids the tokenizer has no text for are written as <|id|>).
  virtual std::string decode_token(int32_t id) const = 0;
  virtual const char* name() const = 0;
  virtual int vocab_size() const = 0;  // ids the tokenizer produces are in [0, vocab_size)
  // Its identity (io/token_corpus.h, tokenizer_fingerprint), compared with the model's.
  virtual std::string fingerprint() const = 0;
};

// io/fingerprint.h

// Token = byte value. A model of vocab_size V > 256 may still emit ids >= 256 (untrained rows of
// its head): those print as <|id|>, never as a wrong byte.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode_token(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    return str_cat("<|", id, "|>");
  }
  const char* name() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  std::string fingerprint() const override { return byte_tokenizer_fingerprint(); }
};

// "bytes" -> ByteTokenizer; any other kind is refused by name (a SentencePiece model is loaded by
// the CLI, which links moetrain_text, and handed to generate as GenerateOptions::tokenizer_impl).
inline std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind) {
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  throw Error(str_cat("--tokenizer '", kind, "': expected bytes or spm:PATH.model"));
}

}  // namespace moe::io
