// Byte accounting per link class. See traffic.h.
#include "comm/traffic.h"

namespace moe::comm {

void TrafficStats::add(LinkClass c, uint64_t n, bool meta) {
  int i = static_cast<int>(c);
  if (meta) {
    meta_bytes[i] += n;
  } else {
    bytes[i] += n;
    messages[i] += 1;
  }
}

void TrafficStats::reset() { *this = TrafficStats{}; }

TrafficStats& TrafficStats::operator+=(const TrafficStats& o) {
  for (int i = 0; i < kNumLinkClasses; ++i) {
    bytes[i] += o.bytes[i];
    messages[i] += o.messages[i];
    meta_bytes[i] += o.meta_bytes[i];
  }
  seconds += o.seconds;
  return *this;
}

uint64_t TrafficStats::inter_node_bytes() const {
  return bytes[static_cast<int>(LinkClass::kInterNode)] +
         bytes[static_cast<int>(LinkClass::kInterGroup)];
}

uint64_t TrafficStats::inter_node_messages() const {
  return messages[static_cast<int>(LinkClass::kInterNode)] +
         messages[static_cast<int>(LinkClass::kInterGroup)];
}

nlohmann::json TrafficStats::to_json() const {
  auto per_class = [](const uint64_t* v) {
    nlohmann::json j = nlohmann::json::object();
    for (int i = 0; i < kNumLinkClasses; ++i) j[link_class_name(static_cast<LinkClass>(i))] = v[i];
    return j;
  };
  return {{"bytes", per_class(bytes)},
          {"messages", per_class(messages)},
          {"meta_bytes", per_class(meta_bytes)},
          {"seconds", seconds}};
}

}  // namespace moe::comm
