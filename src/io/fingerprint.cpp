// Identities of data and tokenizers (see fingerprint.h).
#include "io/fingerprint.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace moe::io {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string hex16(uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = digits[v & 15];
  return s;
}

uint64_t sampled_fnv1a64(int fd, uint64_t size, const std::string& path, uint64_t h) {
  constexpr uint64_t kBlock = 4096, kBlocks = 256, kWhole = uint64_t{1} << 22;
  std::vector<uint8_t> buf(kWhole);
  auto read_at = [&](uint64_t off, uint64_t n) {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error(str_cat(path, ": read failed at byte offset ", off + got, " (", std::strerror(errno), ")"));
      if (r == 0) throw Error(str_cat(path, ": ends at byte ", off + got, ", before its size ", size, " (changed while read)"));
      got += static_cast<size_t>(r);
    }
    h = fnv1a64(buf.data(), n, h);
  };
  if (size <= kWhole) {
    read_at(0, size);
  } else {
    for (uint64_t b = 0; b < kBlocks; ++b) read_at((size - kBlock) / kBlocks * b, kBlock);
    read_at(size - kBlock, kBlock);
  }
  return fnv1a64(&size, sizeof size, h);
}

uint64_t sampled_fnv1a64(const uint8_t* data, uint64_t size) {
  constexpr uint64_t kBlock = 4096, kBlocks = 256, kWhole = uint64_t{1} << 22;
  uint64_t h = 0xcbf29ce484222325ull;
  if (size <= kWhole) {
    h = fnv1a64(data, size, h);
  } else {
    for (uint64_t b = 0; b < kBlocks; ++b) h = fnv1a64(data + (size - kBlock) / kBlocks * b, kBlock, h);
    h = fnv1a64(data + size - kBlock, kBlock, h);
  }
  return fnv1a64(&size, sizeof size, h);
}

std::string tokenizer_fingerprint(const std::string& kind, int vocab_size, std::string_view model_bytes) {
  const std::string head = str_cat("moetrain tokenizer\n", kind, "\n", vocab_size, "\n");
  const uint64_t h = fnv1a64(model_bytes.data(), model_bytes.size(), fnv1a64(head.data(), head.size()));
  return str_cat(kind, "-", vocab_size, "-", hex16(h));
}

std::string byte_tokenizer_fingerprint() { return tokenizer_fingerprint("bytes", 256, {}); }

bool is_tokenizer_fingerprint(const std::string& s) {
  const size_t a = s.find('-'), b = s.rfind('-');
  if (a == std::string::npos || a == b || s.size() - b - 1 != 16 || s.size() > 64) return false;
  const std::string kind = s.substr(0, a), vocab = s.substr(a + 1, b - a - 1), hex = s.substr(b + 1);
  return (kind == "bytes" || kind == "spm") && !vocab.empty() && vocab.size() <= 10 && vocab[0] != '0' &&
         vocab.find_first_not_of("0123456789") == std::string::npos &&
         hex.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string check_tokenizer_match(const std::string& model_fp, const std::string& model_source,
                                  const std::string& data_fp, const std::string& data_source) {
  if (!model_fp.empty() && !data_fp.empty()) {
    MOE_CHECK(model_fp == data_fp, data_source, ": tokenizer fingerprint ", data_fp, ", but the model (", model_source,
              ") was trained on tokenizer ", model_fp, ": its token ids would mean other text");
    return "";
  }
  if (model_fp.empty() && data_fp.empty()) return "";
  return str_cat("note: ", model_fp.empty() ? model_source : data_source,
                 " records no tokenizer fingerprint (written before moetrain recorded them): the tokenizer ",
                 model_fp.empty() ? data_fp : model_fp, " is not checked against it");
}

}  // namespace moe::io
