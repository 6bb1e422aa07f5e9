// Text <-> token ids: the one Tokenizer interface of the project, and its byte-level
// implementation (one token per byte, ids 0..255, what the built-in corpus trains on). The
// SentencePiece implementation lives in text/ (text/tokenizer.h: load_spm, load_tokenizer), the
// only module that links SentencePiece; the trainer and generate see this interface only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/fingerprint.h"

namespace moe::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "bytes" | "spm": the dataset sidecar's and fingerprint's word
  virtual int vocab_size() const = 0;    // ids the tokenizer produces are in [0, vocab_size)
  // encode replaces ids
  virtual void encode(std::string_view text, std::vector<int32_t>& ids) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Its identity (io/fingerprint.h, tokenizer_fingerprint), compared with the model's.
  virtual std::string fingerprint() const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
  }
  // The text of one token id. A model may emit ids the tokenizer has no text for (a head wider
  // than the vocabulary, its untrained rows): those print as <|id|>, never as a wrong byte.
  std::string decode_token(int32_t id) const {
    if (id < 0 || id >= vocab_size()) return str_cat("<|", id, "|>");
    return decode({id});
  }
};

// Token = byte value.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  int vocab_size() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& ids) const override {
    ids.resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (int32_t id : ids) s += id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : str_cat("<|", id, "|>");
    return s;
  }
  std::string fingerprint() const override { return byte_tokenizer_fingerprint(); }
  using Tokenizer::encode;
};

// "bytes" -> ByteTokenizer; any other kind is refused by name (a SentencePiece model is loaded by
// text::load_tokenizer, which the CLI links, and handed to generate as GenerateOptions::tokenizer_impl).
inline std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind) {
  if (kind == "bytes") return std::make_unique<ByteTokenizer>();
  throw Error(str_cat("--tokenizer '", kind, "': expected bytes or spm:PATH.model"));
}

}  // namespace moe::io
