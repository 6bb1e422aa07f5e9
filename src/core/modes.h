// The run's modes, one vocabulary for every module: where the model runs, its GEMM precision, the
// token exchange, the pipeline schedule, activation checkpointing, how device buffers travel, and
// the kind of a cluster's nodes. Each has one parser (parse_X: the only place its words are
// compared) and one name(X) (the word every flag, layout string, profile and report prints).
// A flag that also takes "auto" is a std::optional<X> (std::nullopt = auto): parse_X_or_auto and
// name_or_auto. The CLI, config and JSON readers convert at the edge, once; the code between
// holds the enums.
#pragma once
#include <iosfwd>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

namespace moe {

// clang-format off
enum class Device { kCpu, kCuda };                     // cpu | cuda
enum class Precision { kFp32, kBf16 };                 // fp32 | bf16 (GEMM inputs; fp32 accumulation)
enum class A2a { kFlat, kRbd, kHalo, kRbdHalo };       // flat | rbd | halo | rbd-halo
enum class Schedule { k1F1B, kGPipe };                 // 1f1b | gpipe
enum class Recompute {                                 // none | moe | full
  kNone,  // keep everything
  kMoe,   // MoE layers keep their FFN input only; the MoE block is recomputed
  kFull,  // every layer keeps its input only; the whole block is recomputed
};
enum class CommBackend { kMpi, kNccl };                // mpi | nccl
enum class NodeKind { kGpu, kCpu };                    // gpu | cpu: a cluster profile's "kind"
// clang-format on

const char* name(Device d);
const char* name(Precision p);
const char* name(A2a a);
const char* name(Schedule s);
const char* name(Recompute r);
const char* name(CommBackend b);
const char* name(NodeKind k);
template <class E>
const char* name_or_auto(const std::optional<E>& m) {
  return m ? name(*m) : "auto";
}

// parse_X(text, what): the value named by `text`, or a moe::Error
//   "<what>: unknown <mode> '<text>' (expected a, b or c)"
// where `what` names the flag or field ("--a2a", "cluster.json: \"kind\"").
Device parse_device(std::string_view s, const char* what);
Precision parse_precision(std::string_view s, const char* what);
A2a parse_a2a(std::string_view s, const char* what);
Schedule parse_schedule(std::string_view s, const char* what);
Recompute parse_recompute(std::string_view s, const char* what);
CommBackend parse_comm_backend(std::string_view s, const char* what);
NodeKind parse_node_kind(std::string_view s, const char* what);
// The same with "auto" accepted (std::nullopt).
std::optional<Precision> parse_precision_or_auto(std::string_view s, const char* what);
std::optional<A2a> parse_a2a_or_auto(std::string_view s, const char* what);
std::optional<CommBackend> parse_comm_backend_or_auto(std::string_view s, const char* what);

// The same for any mode E (what parse_X calls): for code that handles every mode alike (the CLI).
template <class E>
E parse_mode(std::string_view s, const char* what);
template <class E>
std::optional<E> parse_mode_or_auto(std::string_view s, const char* what);

// For readers whose messages have their own form (the planner's --layout, a profile's fields):
// the value named by `text` or std::nullopt, and the accepted words ("flat, rbd, halo or rbd-halo").
template <class E>
std::optional<E> find_mode(std::string_view s);
template <class E>
std::string accepted_names();

std::ostream& operator<<(std::ostream& os, Device d);
std::ostream& operator<<(std::ostream& os, Precision p);
std::ostream& operator<<(std::ostream& os, A2a a);
std::ostream& operator<<(std::ostream& os, Schedule s);
std::ostream& operator<<(std::ostream& os, Recompute r);
std::ostream& operator<<(std::ostream& os, CommBackend b);
std::ostream& operator<<(std::ostream& os, NodeKind k);

}  // namespace moe
