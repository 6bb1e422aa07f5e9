// Exact byte accounting of the exchanges, per link class (comm/topology.h). These counts are machine
// independent: they are how RBD and HALO are judged on one machine (DESIGN.md, Topology).
//   bytes[c]      row payload bytes this rank SENT over links of class c (one count per message;
//                 a copy to itself that the algorithm routes as a message counts as kSameRank)
//   messages[c]   non-empty row messages this rank sent over class c
//   meta_bytes[c] counts and metadata sent (plan exchanges, return_values)
//   seconds       wall time spent inside exchange calls
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "comm/topology.h"

namespace moe::comm {

struct TrafficStats {
  uint64_t bytes[kNumLinkClasses] = {};
  uint64_t messages[kNumLinkClasses] = {};
  uint64_t meta_bytes[kNumLinkClasses] = {};
  double seconds = 0;

  // A row message of `bytes` bytes (messages[c] += 1), or metadata (meta = true: meta_bytes only).
  void add(LinkClass c, uint64_t bytes, bool meta = false);
  void reset();
  TrafficStats& operator+=(const TrafficStats& o);

  uint64_t row_bytes(LinkClass c) const { return bytes[static_cast<int>(c)]; }
  uint64_t row_messages(LinkClass c) const { return messages[static_cast<int>(c)]; }
  // Inter-node = kInterNode + kInterGroup (everything that leaves the node).
  uint64_t inter_node_bytes() const;
  uint64_t inter_node_messages() const;

  // {"bytes": {"same_rank": .., "intra_node": .., "inter_node": .., "inter_group": ..},
  //  "messages": {...}, "meta_bytes": {...}, "seconds": s}
  nlohmann::json to_json() const;
};

}  // namespace moe::comm
