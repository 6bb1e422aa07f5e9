// The mailbox of a group of one without MPI (MpiRuntime::local_world): see group_internal.h.
#include <string>
#include <utility>
#include <vector>

#include "comm/group_internal.h"
#include "core/device.h"
#include "core/error.h"

namespace moe::comm::detail {

namespace {
void local_check_count(size_t bytes, int dtype, int64_t count, int tag, const char* op) {
  const int64_t got = static_cast<int64_t>(bytes / dtype_bytes(dtype));
  MOE_CHECK(got == count, op, " on group rank 0 of 1 (peer 0, tag ", tag, "): expected ", count,
            " elements, received ", got);
}
void local_deliver(const std::vector<char>& b, void* dst) {
  if (!b.empty()) device_copy(device_of(dst), dst, Device::kCpu, b.data(), b.size());
}
}  // namespace

void local_send(LocalBox& box, int dtype, const void* data, int64_t count, int tag) {
  std::vector<char> b(static_cast<size_t>(count) * dtype_bytes(dtype));
  if (!b.empty()) device_copy(Device::kCpu, b.data(), device_of(data), data, b.size());
  for (LocalBox::Pending& r : box.recvs) {
    if (r.done || r.tag != tag) continue;
    local_check_count(b.size(), r.dtype, r.count, tag, "MPI_Irecv");
    local_deliver(b, r.dst);
    r.done = true;
    return;
  }
  box.msgs.push_back({tag, std::move(b)});
}
bool local_take(LocalBox& box, int dtype, void* dst, int64_t count, int tag, const char* op) {
  for (auto it = box.msgs.begin(); it != box.msgs.end(); ++it) {
    if (it->tag != tag) continue;
    local_check_count(it->bytes.size(), dtype, count, tag, op);
    local_deliver(it->bytes, dst);
    box.msgs.erase(it);
    return true;
  }
  return false;
}
[[noreturn]] void local_never(const char* op, int tag) {
  throw Error(str_cat(op, " on group rank 0 of 1 (peer 0, tag ", tag,
                      "): nothing was sent to it, so it would wait forever (a world of one)"));
}
bool local_forget(LocalBox& box, uint64_t id) {
  for (auto it = box.recvs.begin(); it != box.recvs.end(); ++it) {
    if (it->id != id) continue;
    const bool done = it->done;
    box.recvs.erase(it);
    return done;
  }
  return true;
}

}  // namespace moe::comm::detail
