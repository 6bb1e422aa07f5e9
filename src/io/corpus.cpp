// Which kind of data --data names, and opening it (see corpus.h).
#include "io/corpus.h"

#include <filesystem>

#include "io/dataset.h"
#include "io/token_corpus.h"

namespace moe::io {
namespace fs = std::filesystem;

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

bool is_indexed_dataset(const std::string& path) {
  if (ends_with(path, ".idx") || ends_with(path, ".bin")) return true;
  std::error_code ec;
  return !fs::exists(path, ec) && fs::exists(path + ".idx", ec);
}

std::string indexed_prefix(const std::string& path) {
  return ends_with(path, ".idx") || ends_with(path, ".bin") ? path.substr(0, path.size() - 4) : path;
}

std::unique_ptr<Corpus> open_corpus(const std::string& path, int vocab_size) {
  if (is_indexed_dataset(path))
    return std::make_unique<TokenCorpus>(TokenCorpus::load(indexed_prefix(path), vocab_size));
  return std::make_unique<ByteCorpus>(ByteCorpus::load(path));
}

double corpus_resident_bytes(const std::string& path) {
  if (is_indexed_dataset(path)) return TokenCorpus::resident_bytes(indexed_prefix(path));
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0.0 : static_cast<double>(n);
}

}  // namespace moe::io
