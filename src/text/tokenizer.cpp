// Byte and SentencePiece tokenizers; BPE training (see tokenizer.h).
#include "text/tokenizer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "io/json_file.h"
#include "io/output_file.h"

namespace moe::text {
namespace {

// A lossless BPE (train_bpe: byte fallback) decodes one piece at a time to the text's bytes, so
// the pieces' texts written one after another are the text.
class SpmTokenizer final : public io::Tokenizer {
 public:
  explicit SpmTokenizer(std::string source) : source_(std::move(source)) {}
  std::string kind() const override { return "spm"; }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  void encode(std::string_view text, std::vector<int32_t>& ids) const override {
    std::vector<int> out;
    const auto st = sp_.Encode(text, &out);
    MOE_CHECK(st.ok(), source_, ": SentencePiece encode failed: ", st.ToString());
    ids.assign(out.begin(), out.end());
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    const auto st = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &s);
    MOE_CHECK(st.ok(), source_, ": SentencePiece decode failed: ", st.ToString());
    return s;
  }
  std::string fingerprint() const override { return fingerprint_; }
  using io::Tokenizer::encode;
  sentencepiece::SentencePieceProcessor sp_;
  std::string fingerprint_;  // of the model's bytes, set by load_spm_bytes

 private:
  std::string source_;
};

// Feeds SentencePiece's trainer the non-empty lines of the texts, from memory.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string_view>& texts) : texts_(texts) { advance(); }
  bool done() const override { return t_ >= texts_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (t_ < texts_.size()) {
      std::string_view s = texts_[t_];
      if (pos_ >= s.size()) {
        ++t_;
        pos_ = 0;
        continue;
      }
      size_t nl = s.find('\n', pos_);
      if (nl == std::string_view::npos) nl = s.size();
      std::string_view line = s.substr(pos_, nl - pos_);
      pos_ = nl + 1;
      if (!line.empty()) {
        line_.assign(line);
        return;
      }
    }
  }
  const std::vector<std::string_view>& texts_;
  size_t t_ = 0, pos_ = 0;
  std::string line_;
};

// SentencePiece logs its progress to stderr (many lines): silenced while it trains, so the CLI
// prints one line of its own; its error, if any, comes back in the Status.
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && null >= 0) ::dup2(null, STDERR_FILENO);
    if (null >= 0) ::close(null);
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
    }
  }

 private:
  int saved_ = -1;
};

}  // namespace

std::unique_ptr<io::Tokenizer> load_spm(const std::string& model_path) {
  MOE_CHECK(std::ifstream(model_path).good(), "--tokenizer spm:", model_path, ": cannot open the SentencePiece model");
  return load_spm_bytes(io::read_file_bounded(model_path, "SentencePiece model", size_t{1} << 30), model_path);
}

std::unique_ptr<io::Tokenizer> load_spm_bytes(const std::string& model_bytes, const std::string& source) {
  auto t = std::make_unique<SpmTokenizer>(source);
  const auto st = t->sp_.LoadFromSerializedProto(model_bytes);
  MOE_CHECK(st.ok(), "--tokenizer spm:", source, ": not a SentencePiece model (", st.ToString(), ")");
  t->fingerprint_ = io::tokenizer_fingerprint("spm", t->vocab_size(), model_bytes);
  return t;
}

std::unique_ptr<io::Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec.rfind("spm:", 0) == 0) {
    const std::string path = spec.substr(4);
    return load_spm_bytes(io::read_file_bounded(path, "SentencePiece model", size_t{1} << 30), path);
  }
  return io::make_tokenizer(spec);
}

void train_bpe(const std::vector<std::string_view>& texts, int vocab_size, const std::string& model_path,
               const std::string& flag) {
  io::write_file_atomic(model_path, train_bpe_model(texts, vocab_size), flag);
}

std::string train_bpe_model(const std::vector<std::string_view>& texts, int vocab_size) {
  MOE_CHECK(vocab_size >= 260 && vocab_size <= 1000000, "--tokenizer bpe:", vocab_size,
            ": the vocabulary must be in [260, 1000000] (256 byte pieces, <unk> and merges)");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"character_coverage", "1.0"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"max_sentence_length", "65536"},
      {"model_prefix", ""}};
  LineIterator lines(texts);
  std::string proto;
  sentencepiece::util::Status st;
  {
    QuietStderr quiet;
    st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  }
  MOE_CHECK(st.ok(), "--tokenizer bpe:", vocab_size, ": SentencePiece training failed: ", st.ToString());
  return proto;
}

}  // namespace moe::text
