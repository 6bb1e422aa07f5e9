// The modes' words, one table each. See modes.h.
#include "core/modes.h"

#include <ostream>

#include "core/error.h"

namespace moe {

namespace {

template <class E>
struct Word {
  E value;
  const char* word;
};

// Each mode's table: its words in the order messages list them, and what one value is called.
template <class E>
struct Table;
template <>
struct Table<Device> {
  static constexpr const char* kMode = "device";
  static constexpr Word<Device> kWords[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
};
template <>
struct Table<Precision> {
  static constexpr const char* kMode = "precision";
  static constexpr Word<Precision> kWords[] = {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}};
};
template <>
struct Table<A2a> {
  static constexpr const char* kMode = "all-to-all algorithm";
  static constexpr Word<A2a> kWords[] = {
      {A2a::kFlat, "flat"}, {A2a::kRbd, "rbd"}, {A2a::kHalo, "halo"}, {A2a::kRbdHalo, "rbd-halo"}};
};
template <>
struct Table<Schedule> {
  static constexpr const char* kMode = "pipeline schedule";
  static constexpr Word<Schedule> kWords[] = {{Schedule::k1F1B, "1f1b"}, {Schedule::kGPipe, "gpipe"}};
};
template <>
struct Table<Recompute> {
  static constexpr const char* kMode = "recompute mode";
  static constexpr Word<Recompute> kWords[] = {
      {Recompute::kNone, "none"}, {Recompute::kMoe, "moe"}, {Recompute::kFull, "full"}};
};
template <>
struct Table<CommBackend> {
  static constexpr const char* kMode = "backend";
  static constexpr Word<CommBackend> kWords[] = {{CommBackend::kMpi, "mpi"}, {CommBackend::kNccl, "nccl"}};
};
template <>
struct Table<NodeKind> {
  static constexpr const char* kMode = "node kind";
  static constexpr Word<NodeKind> kWords[] = {{NodeKind::kGpu, "gpu"}, {NodeKind::kCpu, "cpu"}};
};

template <class E>
const char* word_of(E v) {
  for (const Word<E>& w : Table<E>::kWords)
    if (w.value == v) return w.word;
  return "?";
}

// "a, b or c", with "auto" last when it is accepted.
template <class E>
std::string list_words(bool with_auto) {
  std::string out;
  constexpr size_t n = std::size(Table<E>::kWords);
  const size_t total = n + (with_auto ? 1 : 0);
  for (size_t i = 0; i < total; ++i) {
    if (i > 0) out += i + 1 == total ? " or " : ", ";
    out += i < n ? Table<E>::kWords[i].word : "auto";
  }
  return out;
}

template <class E>
E parse_word(std::string_view s, const char* what, bool with_auto) {
  if (std::optional<E> v = find_mode<E>(s)) return *v;
  throw Error(str_cat(what, ": unknown ", Table<E>::kMode, " '", s, "' (expected ", list_words<E>(with_auto), ")"));
}

}  // namespace

template <class E>
E parse_mode(std::string_view s, const char* what) {
  return parse_word<E>(s, what, false);
}

template <class E>
std::optional<E> parse_mode_or_auto(std::string_view s, const char* what) {
  if (s == "auto") return std::nullopt;
  return parse_word<E>(s, what, true);
}

template <class E>
std::optional<E> find_mode(std::string_view s) {
  for (const Word<E>& w : Table<E>::kWords)
    if (s == w.word) return w.value;
  return std::nullopt;
}

template <class E>
std::string accepted_names() {
  return list_words<E>(false);
}

#define MOE_MODE(E)                                                                      \
  template std::optional<E> find_mode<E>(std::string_view s);                            \
  template std::string accepted_names<E>();                                              \
  template E parse_mode<E>(std::string_view s, const char* what);                        \
  template std::optional<E> parse_mode_or_auto<E>(std::string_view s, const char* what); \
  const char* name(E v) { return word_of(v); }                                           \
  std::ostream& operator<<(std::ostream& os, E v) { return os << word_of(v); }
MOE_MODE(Device)
MOE_MODE(Precision)
MOE_MODE(A2a)
MOE_MODE(Schedule)
MOE_MODE(Recompute)
MOE_MODE(CommBackend)
MOE_MODE(NodeKind)
#undef MOE_MODE

Device parse_device(std::string_view s, const char* what) { return parse_mode<Device>(s, what); }
Precision parse_precision(std::string_view s, const char* what) { return parse_mode<Precision>(s, what); }
A2a parse_a2a(std::string_view s, const char* what) { return parse_mode<A2a>(s, what); }
Schedule parse_schedule(std::string_view s, const char* what) { return parse_mode<Schedule>(s, what); }
Recompute parse_recompute(std::string_view s, const char* what) { return parse_mode<Recompute>(s, what); }
CommBackend parse_comm_backend(std::string_view s, const char* what) { return parse_mode<CommBackend>(s, what); }
NodeKind parse_node_kind(std::string_view s, const char* what) { return parse_mode<NodeKind>(s, what); }

std::optional<Precision> parse_precision_or_auto(std::string_view s, const char* what) {
  return parse_mode_or_auto<Precision>(s, what);
}
std::optional<A2a> parse_a2a_or_auto(std::string_view s, const char* what) {
  return parse_mode_or_auto<A2a>(s, what);
}
std::optional<CommBackend> parse_comm_backend_or_auto(std::string_view s, const char* what) {
  return parse_mode_or_auto<CommBackend>(s, what);
}

}  // namespace moe
