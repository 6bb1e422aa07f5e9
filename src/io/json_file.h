// The one way this program parses JSON it did not write itself (config.json, HF configs, cluster
// profiles, checkpoint manifests, safetensors headers, metrics.jsonl lines): bounded in depth and
// size before nlohmann sees it, so hostile input is an error naming the file, never a stack
// overflow (deep nesting recurses in nlohmann's value destructor and dump) or an unbounded read.
// Errors name the file, say what it was meant to be ("cannot open <what>") or quote the parser
// ("not valid JSON (...)") without the text it read: an error message never quotes a file's bytes
// (a config.json that is really /etc/passwd must not print "root:x:0"). Values and names taken
// from a parsed file reach messages only through quoted() / excerpt(): escaped to one ASCII line
// and cut short.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "io/data_file.h"

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

// A name or string taken from a file, for an error message: JSON-quoted with every non-ASCII or
// control byte escaped (so it stays one line), cut to about max characters ("...\"" marks a cut).
inline std::string quoted(std::string_view s, size_t max = 120) {
  const bool cut = s.size() > max;
  std::string d = nlohmann::json(std::string(s.substr(0, cut ? max : s.size())))
                      .dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (cut || d.size() > max + 2) d = d.substr(0, std::min(d.size() - 1, max)) + "...\"";
  return d;
}

// A JSON value from a file, for an error message: its compact dump, ASCII, cut to about max
// characters (a 60 MB string or a million-element array is shown by its first characters).
inline std::string excerpt(const nlohmann::json& v, size_t max = 64) {
  std::string d = v.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (d.size() > max) d = d.substr(0, max) + "...";
  return d;
}

// nlohmann's message without the text it was reading: "; last read: '<token>'" and "parsing
// '<number>'" quote the file's bytes (the first letters of /etc/passwd, say). What the parser
// expected and where (line, column, byte) stay.
inline std::string parser_message(const std::string& what) {
  std::string m = what;
  const std::string last = "; last read: '";
  if (size_t at = m.find(last); at != std::string::npos) {
    const size_t exp = m.rfind("; expected ");
    const std::string tail = exp != std::string::npos && exp > at && m.size() - exp < 80 ? m.substr(exp) : "";
    m = m.substr(0, at) + tail;
  }
  const std::string num = "number overflow parsing '";
  if (size_t at = m.find(num); at != std::string::npos) m = m.substr(0, at) + "number overflow (beyond a 64-bit double)";
  return m;
}

// Depth-checked parse of JSON text; parse errors and running out of memory become a moe::Error
// naming source. cb is nlohmann's parser callback (e.g. to see duplicate keys), may be null.
inline nlohmann::json parse_json(std::string_view text, const std::string& source,
                                 const nlohmann::json::parser_callback_t& cb = nullptr) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(source, ": not valid JSON (", parser_message(e.what()), ")"));
  } catch (const std::bad_alloc&) {
    throw Error(str_cat(source, ": out of memory parsing ", text.size(), " bytes of JSON"));
  }
}

// Reads a whole file of at most max_bytes. Refuses directories; a FIFO or character device is
// read up to the bound, so /dev/zero is an error, not an endless read. With no_follow (a file
// found inside a folder: an export's config.json, a checkpoint's manifest, a dataset's sidecar) it
// is opened as every such data file is (io::open_data_file, Origin::kInFolder): a symbolic link,
// a FIFO or a device is refused. Errors name path and `what` the file was meant to be.
inline std::string read_file_bounded(const std::string& path, const char* what,
                                     size_t max_bytes = kMaxJsonFileBytes, bool no_follow = false) {
  const int fd = no_follow ? open_data_file(path, what, Origin::kInFolder).release()
                           : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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

// no_follow: a file found inside a folder (see read_file_bounded).
inline nlohmann::json read_json_file(const std::string& path, const char* what, bool no_follow = false) {
  return parse_json(read_file_bounded(path, what, kMaxJsonFileBytes, no_follow), path);
}

}  // namespace moe::io
