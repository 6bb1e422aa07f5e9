// The SentencePiece implementation of io::Tokenizer (io/tokenizer.h, the one interface; bytes is
// io::ByteTokenizer there): loading a model (a BPE trained here by train_bpe, or any existing
// .model) and training one. SentencePiece is linked into this module only (moetrain_text); the
// trainer reads datasets and their sidecar, never a model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"

namespace moe::text {

// Loads a SentencePiece model file (read once: the bytes loaded are the bytes fingerprinted);
// errors name the path.
std::unique_ptr<io::Tokenizer> load_spm(const std::string& model_path);
// The same from the model file's bytes (read by the caller); errors name `source`.
std::unique_ptr<io::Tokenizer> load_spm_bytes(const std::string& model_bytes, const std::string& source);
// generate's --tokenizer: "bytes" or "spm:PATH.model"; anything else is refused by name.
std::unique_ptr<io::Tokenizer> load_tokenizer(const std::string& spec);

// Trains a lossless SentencePiece BPE of vocab_size pieces on the lines of `texts` and writes the
// model to model_path (through io::write_file_atomic: a new or regular file, errors name `flag`). Lossless: identity normalisation, no dummy
// prefix, whitespace kept as it is, byte fallback for every character not in the vocabulary
// (newlines among them: training sees lines), so decode(encode(x)) == x and nats per token
// convert exactly to nats per byte of the text. No BOS/EOS/PAD pieces; id 0 is <unk> (never
// produced with byte fallback). vocab_size must leave room for the 256 byte pieces and the
// characters of the text (SentencePiece's own error names the minimum).
void train_bpe(const std::vector<std::string_view>& texts, int vocab_size, const std::string& model_path,
               const std::string& flag = "SentencePiece model");
// The same, returning the model file's bytes instead of writing them (tokenize publishes the model
// with the dataset, io/indexed_dataset.h).
std::string train_bpe_model(const std::vector<std::string_view>& texts, int vocab_size);

}  // namespace moe::text
