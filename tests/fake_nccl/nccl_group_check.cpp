// comm::Group's NCCL path (comm/nccl.cpp: NcclComm's grouped ncclSend/ncclRecv alltoallv and its
// all-reduce) on the emulated device through the fake libnccl.so.2, against the same Group calls
// over MPI on host buffers: every received byte and every reduced bit must be equal. Training
// moves only all-reduces over NCCL (the token exchange stages its device buffers through the host
// before its algorithms), so this is where the alltoallv's grouping and ordering are exercised:
// irregular counts with zeros, a segment to itself, gaps between the receive segments (left as
// they were), several rounds on one communicator, on the world and on two sub-groups whose NCCL
// communicators are made at the same time (with 4 ranks: roots on world ranks 0 and 1).
// Usage: mpirun -np N nccl_group_check, with MOETRAIN_EMULATED_GPUS >= N and the fake first on
// LD_LIBRARY_PATH. Prints "PASS Group over NCCL == Group over MPI ..." on rank 0; exit 0 on success.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl.h"
#include "core/device.h"
#include "core/error.h"

namespace {

using moe::Device;
using moe::comm::Group;

int g_fail = 0;
int g_world_rank = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_fail;
  std::fprintf(stderr, "FAIL [world rank %d] %s\n", g_world_rank, what.c_str());
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  const size_t bytes = h.size() * sizeof(T);
  void* d = moe::device_alloc_uninit(Device::kCuda, bytes + sizeof(T));
  moe::device_copy(Device::kCuda, d, Device::kCpu, h.data(), bytes);
  return static_cast<T*>(d);
}
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  moe::device_copy(Device::kCpu, h.data(), Device::kCuda, d, n * sizeof(T));
  return h;
}

template <typename T>
std::vector<T> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(std::ldexp(static_cast<double>(g() % 2000001) - 1e6, static_cast<int>(g() % 30) - 15));
    else
      x = static_cast<T>(static_cast<int64_t>(g() % 2000001) - 1000000);
  }
  return v;
}

// One alltoallv of T over `nccl` (device buffers) and `mpi` (host buffers), compared.
template <typename T>
void alltoallv_case(const Group& nccl, const Group& mpi, int round, const char* name) {
  const int n = nccl.size(), me = nccl.rank();
  // Zeros too; round 2's messages are large enough for MPI's rendezvous protocol.
  auto count = [&](int from, int to) { return (from * 3 + to * 5 + round * 7) % 6 * (round == 2 ? 20000 : 1); };
  std::vector<int> sc(n), sd(n), rc(n), rd(n);
  int s_total = 0, r_total = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = count(me, p);
    rc[p] = count(p, me);
  }
  // Send segments in reverse peer order, receive segments with a gap of 2 before each.
  for (int p = n - 1; p >= 0; --p) {
    sd[p] = s_total;
    s_total += sc[p];
  }
  for (int p = 0; p < n; ++p) {
    rd[p] = r_total + 2;
    r_total += rc[p] + 2;
  }
  const std::vector<T> send = random_values<T>(static_cast<size_t>(s_total),
                                               1000u * static_cast<uint64_t>(round) + 17u * me + 1);
  const std::vector<T> before = random_values<T>(static_cast<size_t>(r_total), 99u + static_cast<uint64_t>(me));
  T* dsend = to_device(send);
  T* drecv = to_device(before);
  std::vector<T> hrecv = before;
  nccl.alltoallv(dsend, sc, sd, drecv, rc, rd);
  mpi.alltoallv(send.data(), sc, sd, hrecv.data(), rc, rd);
  const std::vector<T> got = to_host(drecv, hrecv.size());
  expect(std::memcmp(got.data(), hrecv.data(), got.size() * sizeof(T)) == 0,
         std::string(name) + " round " + std::to_string(round) + ": alltoallv over NCCL != over MPI");
  moe::device_free(Device::kCuda, dsend);
  moe::device_free(Device::kCuda, drecv);
}

template <typename T>
void allreduce_case(const Group& nccl, const Group& mpi, bool max, size_t len, const char* name) {
  const std::vector<T> v = random_values<T>(len, 7u * static_cast<uint64_t>(nccl.rank()) + len + max);
  T* d = to_device(v);
  std::vector<T> h = v;
  if (max) {
    if constexpr (!std::is_same_v<T, float>) {
      nccl.allreduce_max(d, static_cast<int64_t>(len));
      mpi.allreduce_max(h.data(), static_cast<int64_t>(len));
    }
  } else {
    nccl.allreduce_sum(d, static_cast<int64_t>(len));
    mpi.allreduce_sum(h.data(), static_cast<int64_t>(len));
  }
  const std::vector<T> got = to_host(d, len);
  expect(std::memcmp(got.data(), h.data(), len * sizeof(T)) == 0,
         std::string(name) + ": all-reduce over NCCL != over MPI (bit for bit)");
  moe::device_free(Device::kCuda, d);
}

void check_pair(const Group& nccl, const Group& mpi, const char* name) {
  expect(nccl.nccl_enabled() && !mpi.nccl_enabled(), std::string(name) + ": NCCL enabled on one group only");
  for (int round = 0; round < 3; ++round) {
    alltoallv_case<float>(nccl, mpi, round, name);
    alltoallv_case<int32_t>(nccl, mpi, round, name);
  }
  for (size_t len : {size_t{5}, size_t{3001}}) {
    allreduce_case<float>(nccl, mpi, false, len, name);
    allreduce_case<double>(nccl, mpi, false, len, name);
    allreduce_case<int64_t>(nccl, mpi, false, len, name);
    allreduce_case<double>(nccl, mpi, true, len, name);
    allreduce_case<int64_t>(nccl, mpi, true, len, name);
  }
}

}  // namespace

int main(int argc, char** argv) {
  moe::comm::MpiRuntime mpi(&argc, &argv);
  try {
    Group world = Group::world();
    g_world_rank = world.rank();
    moe::select_device(Device::kCuda, world.rank());  // one host: the local rank is the world rank
    std::string why;
    if (!moe::comm::nccl_loadable(&why)) throw moe::Error("NCCL: " + why);
    Group nccl_world = Group::world(), mpi_world = Group::world();
    nccl_world.enable_nccl();
    check_pair(nccl_world, mpi_world, "world");
    if (world.size() >= 4) {  // two groups of world ranks {0, 2, ...} and {1, 3, ...}
      Group nccl_sub = world.split(world.rank() % 2, world.rank());
      Group mpi_sub = world.split(world.rank() % 2, world.rank());
      nccl_sub.enable_nccl();
      check_pair(nccl_sub, mpi_sub, "sub-group");
    }
    int fails = 0;
    const double mine = g_fail;
    std::vector<double> all(static_cast<size_t>(world.size()));
    world.allgather(&mine, all.data(), 1);
    for (double f : all) fails += static_cast<int>(f);
    if (world.rank() == 0)
      std::printf("%s Group over NCCL == Group over MPI (alltoallv, all-reduce) on %d ranks (%d failures)\n",
                  fails ? "FAIL" : "PASS", world.size(), fails);
    return fails ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL [world rank %d] %s\n", g_world_rank, e.what());
    moe::comm::MpiRuntime::abort(1);
  }
  return 1;
}
