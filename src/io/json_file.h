// The one way this program parses JSON it did not write itself (config.json, HF configs, cluster
// profiles, checkpoint manifests, safetensors headers, metrics.jsonl lines): bounded in depth and
// size before nlohmann sees it, so hostile input is an error naming the file, never a stack
// overflow (deep nesting recurses in nlohmann's value destructor and dump) or an unbounded read.
// Errors name the file, say what it was meant to be ("cannot open <what>") or quote the parser
// ("not valid JSON (...)").
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace moe::io {

// Arrays/objects nested deeper than this are refused. Real configs nest 2-4 levels.
constexpr int kMaxJsonDepth = 256;
// Largest JSON file read whole (config, profile); manifests pass their own, larger bound.
constexpr size_t kMaxJsonFileBytes = size_t{64} << 20;

// Throws a moe::Error "<source>: JSON nested deeper than N levels (at byte B)" when text opens
// more than max_depth arrays/objects at once. A linear scan that skips strings; it does not
// validate anything else (the parser does).
inline void check_json_depth(std::string_view text, const std::string& source,
                             int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character (\" must not end the string)
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      MOE_CHECK(++depth <= max_depth, source, ": JSON nested deeper than ", max_depth,
                " levels (at byte ", i, ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

// Depth-checked parse of JSON text; parse errors and running out of memory become a moe::Error
// naming source. cb is nlohmann's parser callback (e.g. to see duplicate keys), may be null.
inline nlohmann::json parse_json(std::string_view text, const std::string& source,
                                 const nlohmann::json::parser_callback_t& cb = nullptr) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(source, ": not valid JSON (", e.what(), ")"));
  } catch (const std::bad_alloc&) {
    throw Error(str_cat(source, ": out of memory parsing ", text.size(), " bytes of JSON"));
  }
}

// Reads a whole file of at most max_bytes. Refuses directories and (with no_follow) a symlink
// as the last path component; a FIFO or character device is read up to the bound, so /dev/zero
// is an error, not an endless read. Errors name path and `what` the file was meant to be.
inline std::string read_file_bounded(const std::string& path, const char* what,
                                     size_t max_bytes = kMaxJsonFileBytes, bool no_follow = false) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (no_follow ? O_NOFOLLOW : 0));
  if (fd < 0 && no_follow && errno == ELOOP)
    throw Error(str_cat(path, ": is a symbolic link; a ", what, " must be a plain file"));
  MOE_CHECK(fd >= 0, path, ": cannot open ", what, " (", std::strerror(errno), ")");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  MOE_CHECK(::fstat(fd, &st) == 0, path, ": cannot stat ", what, " (", std::strerror(errno), ")");
  MOE_CHECK(!S_ISDIR(st.st_mode), path, ": is a folder, not a ", what);
  if (S_ISREG(st.st_mode))
    MOE_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes, path, ": ", what, " is ",
              st.st_size, " bytes, more than the limit of ", max_bytes);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    MOE_CHECK(n >= 0, path, ": cannot read ", what, " (", std::strerror(errno), ")");
    if (n == 0) break;
    MOE_CHECK(out.size() + static_cast<size_t>(n) <= max_bytes, path, ": ", what,
              " is more than the limit of ", max_bytes, " bytes");
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

inline nlohmann::json read_json_file(const std::string& path, const char* what) {
  return parse_json(read_file_bounded(path, what), path);
}

}  // namespace moe::io
