// Error type of the whole project. Every failure that a user can cause (bad file, bad flag, bad
// config) is a moe::Error whose message names the file, field or value at fault; the CLI prints it
// and exits non-zero. MOE_CHECK is for conditions a caller can violate; it never aborts.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace moe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... R>
void append(std::ostringstream& os, const T& v, const R&... rest) {
  os << v;
  append(os, rest...);
}
}  // namespace detail

// Builds a message from any streamable pieces: str_cat("expected ", n, " got ", m).
template <class... A>
std::string str_cat(const A&... a) {
  std::ostringstream os;
  detail::append(os, a...);
  return os.str();
}

}  // namespace moe

#define MOE_CHECK(cond, ...)                                      \
  do {                                                            \
    if (!(cond)) throw ::moe::Error(::moe::str_cat(__VA_ARGS__)); \
  } while (0)
