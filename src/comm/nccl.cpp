// The NCCL backend. See nccl.h. Only nccl.h's types are used at compile time; the functions are
// resolved from libnccl.so.2 with dlsym on first use.
#include "comm/nccl.h"

#include <cstring>

#include "comm/group.h"
#include "core/error.h"

// The emulated CUDA build (MOETRAIN_EMULATED_CUDA) takes this path too, with the fake
// libnccl.so.2 of tests/fake_nccl (NCCL's API over MPI, staging through the SIMT shim's
// cudaMemcpy); a real NCCL cannot reach the emulated device's memory and is refused there.
#if defined(MOETRAIN_HAVE_CUDA)
#define MOE_NCCL 1
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace moe::comm {

CommBackend choose_comm_backend(std::optional<CommBackend> req,
                                const std::vector<std::pair<double, int>>& gpu_of_rank,
                                bool loadable, std::string* why,
                                const std::string& not_loadable) {
  auto say = [why](std::string s) {
    if (why) *why = std::move(s);
  };
  if (req == CommBackend::kMpi) {
    say("requested");
    return CommBackend::kMpi;
  }
  std::string no;
  const size_t n = gpu_of_rank.size();
  if (n < 2) no = "one rank";
  for (size_t r = 0; no.empty() && r < n; ++r)
    if (gpu_of_rank[r].second < 0) no = str_cat("rank ", r, " has no GPU (--device cpu)");
  for (size_t a = 0; no.empty() && a < n; ++a)
    for (size_t b = a + 1; no.empty() && b < n; ++b)
      if (gpu_of_rank[a] == gpu_of_rank[b])
        no = str_cat("ranks ", a, " and ", b, " share GPU ", gpu_of_rank[a].second,
                     " of one host (NCCL needs a GPU per rank)");
  if (no.empty() && !loadable)
    no = not_loadable.empty() ? "NCCL is not available" : "NCCL is not available: " + not_loadable;
  if (no.empty()) {
    say("every rank has its own GPU");
    return CommBackend::kNccl;
  }
  MOE_CHECK(req != CommBackend::kNccl, "--comm.backend nccl: ", no,
            "; use --comm.backend mpi (device buffers staged through the host)");
  say(no);
  return CommBackend::kMpi;
}

#ifdef MOE_NCCL
namespace {
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  std::string failure;  // why it could not be loaded ("" when loaded)
};

const NcclApi& api() {
  static const NcclApi a = [] {
    NcclApi x;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      x.failure = str_cat("libnccl.so.2 could not be opened (", e ? e : "unknown", ")");
      return x;
    }
    // The real NCCL and the fake one (tests/fake_nccl, marked by moetrain_fake_nccl) each work
    // only in their own build: the fake moves emulated device memory through the SIMT shim, the
    // real one needs a GPU.
    const bool fake = dlsym(h, "moetrain_fake_nccl") != nullptr;
#ifdef MOETRAIN_EMULATED_CUDA
    if (!fake) {
      x.failure = "libnccl.so.2 is a real NCCL, which cannot reach the emulated device's memory "
                  "(put the fake one, <build>/fake_nccl, first on LD_LIBRARY_PATH)";
      dlclose(h);
      return x;
    }
#else
    if (fake) {
      x.failure = "libnccl.so.2 is moetrain's fake NCCL for the emulated device (tests/fake_nccl)";
      dlclose(h);
      return x;
    }
#endif
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      if (!p && x.failure.empty()) x.failure = str_cat("libnccl.so.2 lacks ", name);
      return p;
    };
    x.get_unique_id = reinterpret_cast<decltype(x.get_unique_id)>(sym("ncclGetUniqueId"));
    x.comm_init_rank = reinterpret_cast<decltype(x.comm_init_rank)>(sym("ncclCommInitRank"));
    x.comm_destroy = reinterpret_cast<decltype(x.comm_destroy)>(sym("ncclCommDestroy"));
    x.all_reduce = reinterpret_cast<decltype(x.all_reduce)>(sym("ncclAllReduce"));
    x.send = reinterpret_cast<decltype(x.send)>(sym("ncclSend"));
    x.recv = reinterpret_cast<decltype(x.recv)>(sym("ncclRecv"));
    x.group_start = reinterpret_cast<decltype(x.group_start)>(sym("ncclGroupStart"));
    x.group_end = reinterpret_cast<decltype(x.group_end)>(sym("ncclGroupEnd"));
    x.error_string = reinterpret_cast<decltype(x.error_string)>(sym("ncclGetErrorString"));
    return x;
  }();
  return a;
}

void check(ncclResult_t r, const char* op, int rank, int size) {
  if (r == ncclSuccess) return;
  throw Error(str_cat(op, " failed on group rank ", rank, " of ", size, ": ",
                      api().error_string ? api().error_string(r) : "NCCL error"));
}

void sync(const char* op) {
  cudaError_t e = cudaStreamSynchronize(nullptr);
  MOE_CHECK(e == cudaSuccess, op, ": cudaStreamSynchronize: ", cudaGetErrorString(e));
}

ncclDataType_t nccl_type(int dtype) {
  switch (dtype) {
    case 0: return ncclFloat32;
    case 1: return ncclInt32;
    case 2: return ncclFloat64;
    default: return ncclInt64;
  }
}
size_t elem_bytes(int dtype) { return dtype <= 1 ? 4 : 8; }
}  // namespace

bool nccl_loadable(std::string* why) {
  if (!api().failure.empty()) {
    if (why) *why = api().failure;
    return false;
  }
  return true;
}

NcclComm::NcclComm(const Group& g) : rank_(g.rank()), size_(g.size()) {
  std::string why;
  MOE_CHECK(nccl_loadable(&why), "NCCL: ", why);
  // The unique id travels as int32 words over MPI (an all-gather; rank 0's is used).
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0, "ncclUniqueId size");
  constexpr int kWords = sizeof(ncclUniqueId) / sizeof(int32_t);
  ncclUniqueId id{};
  if (rank_ == 0) check(api().get_unique_id(&id), "ncclGetUniqueId", rank_, size_);
  std::vector<int32_t> mine(kWords), all(static_cast<size_t>(kWords) * size_);
  std::memcpy(mine.data(), &id, sizeof id);
  g.allgather(mine.data(), all.data(), kWords);
  std::memcpy(&id, all.data(), sizeof id);
  ncclComm_t c = nullptr;
  check(api().comm_init_rank(&c, size_, id, rank_), "ncclCommInitRank", rank_, size_);
  comm_ = c;
}

NcclComm::~NcclComm() {
  if (comm_) (void)api().comm_destroy(static_cast<ncclComm_t>(comm_));
}

void NcclComm::allreduce(void* data, int64_t count, int dtype, int op) const {
  if (count <= 0) return;
  check(api().all_reduce(data, data, static_cast<size_t>(count), nccl_type(dtype),
                         op == 0 ? ncclSum : ncclMax, static_cast<ncclComm_t>(comm_), nullptr),
        "ncclAllReduce", rank_, size_);
  sync("ncclAllReduce");
}

void NcclComm::alltoallv(const void* send, const std::vector<int>& sc, const std::vector<int>& sd,
                         void* recv, const std::vector<int>& rc, const std::vector<int>& rd,
                         int dtype) const {
  const size_t b = elem_bytes(dtype);
  const auto c = static_cast<ncclComm_t>(comm_);
  check(api().group_start(), "ncclGroupStart", rank_, size_);
  for (int p = 0; p < size_; ++p) {
    if (sc[p] > 0)
      check(api().send(static_cast<const char*>(send) + static_cast<size_t>(sd[p]) * b, sc[p],
                       nccl_type(dtype), p, c, nullptr),
            "ncclSend", rank_, size_);
    if (rc[p] > 0)
      check(api().recv(static_cast<char*>(recv) + static_cast<size_t>(rd[p]) * b, rc[p],
                       nccl_type(dtype), p, c, nullptr),
            "ncclRecv", rank_, size_);
  }
  check(api().group_end(), "ncclGroupEnd", rank_, size_);
  sync("ncclAlltoallv");
}

#else  // no CUDA backend: NCCL is never loadable

bool nccl_loadable(std::string* why) {
  if (why) *why = "this moetrain was built without the CUDA backend";
  return false;
}
NcclComm::NcclComm(const Group& g) : rank_(g.rank()), size_(g.size()) {
  throw Error("NCCL: this moetrain was built without the CUDA backend");
}
NcclComm::~NcclComm() = default;
void NcclComm::allreduce(void*, int64_t, int, int) const {}
void NcclComm::alltoallv(const void*, const std::vector<int>&, const std::vector<int>&, void*,
                         const std::vector<int>&, const std::vector<int>&, int) const {}
#endif

}  // namespace moe::comm
