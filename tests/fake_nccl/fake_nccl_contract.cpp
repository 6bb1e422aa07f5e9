// The fake NCCL's contract (tests/fake_nccl/fake_nccl.cpp), checked through its C API on the
// emulated device: argument and usage errors with NCCL's result codes and strings that name the
// problem, communicator creation from a unique id, all-reduce bit-identical to MPI_Allreduce, and
// the grouping and ordering of send/receive. Run under mpirun on 2 or more ranks with
// MOETRAIN_EMULATED_GPUS >= the number of ranks. The two cases that wait for the fake's
// FAKE_NCCL_TIMEOUT_S set it to 1 s around themselves (60 s elsewhere). Prints "PASS fake NCCL
// contract" on rank 0, or one FAIL line per broken expectation; the exit status is 0 only when
// every rank passed.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

int g_rank = 0, g_size = 1, g_fail = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_fail;
  std::fprintf(stderr, "FAIL [rank %d] %s\n", g_rank, what.c_str());
}

// `got` must be `want`, and ncclGetErrorString(got) must contain `substr`.
void expect_code(ncclResult_t got, ncclResult_t want, const char* substr, const char* what) {
  const std::string s = ncclGetErrorString(got);
  const bool ok = got == want && (!substr || s.find(substr) != std::string::npos);
  expect(ok, std::string(what) + ": got " + std::to_string(got) + " (" + s + "), want " +
                 std::to_string(want) + (substr ? std::string(" containing '") + substr + "'" : ""));
  if (ok && g_rank == 0 && want != ncclSuccess) std::printf("  ok  %-44s %s\n", what, s.c_str());
}

void cuda_ok(cudaError_t e, const char* what) {
  expect(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  cuda_ok(cudaMalloc(&p, n * sizeof(T) + 1), "cudaMalloc");
  return static_cast<T*>(p);
}
template <typename T>
void to_dev(T* d, const std::vector<T>& h) {
  cuda_ok(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
template <typename T>
std::vector<T> from_dev(const T* d, size_t n) {
  std::vector<T> h(n);
  cuda_ok(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return h;
}

ncclUniqueId shared_id() {  // made on world rank 0, broadcast (as moetrain's NcclComm does)
  ncclUniqueId id{};
  if (g_rank == 0) expect_code(ncclGetUniqueId(&id), ncclSuccess, nullptr, "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  return id;
}

// Values whose float sums depend on the order of addition, so a different reduction order shows.
template <typename T>
std::vector<T> data(size_t n, int salt) {
  std::mt19937_64 g(1234 + 977 * static_cast<uint64_t>(g_rank) + static_cast<uint64_t>(salt));
  std::vector<T> v(n);
  for (auto& x : v) {
    const double u = std::ldexp(static_cast<double>(g() % 2000001) - 1000000.0, static_cast<int>(g() % 40) - 20);
    if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(u);
    else x = static_cast<T>(static_cast<int64_t>(g() % 2000001) - 1000000);
  }
  return v;
}

template <typename T>
void allreduce_case(ncclComm_t c, MPI_Comm ref, ncclDataType_t t, MPI_Datatype mt, ncclRedOp_t op,
                    MPI_Op mop, size_t n, bool in_place, const char* name) {
  const std::vector<T> h = data<T>(n, static_cast<int>(op) * 31 + static_cast<int>(t));
  T* s = dev_alloc<T>(n);
  T* r = in_place ? s : dev_alloc<T>(n);
  to_dev(s, h);
  expect_code(ncclAllReduce(s, r, n, t, op, c, nullptr), ncclSuccess, nullptr, name);
  std::vector<T> want = h;
  MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(n), mt, mop, ref);
  if (op == ncclAvg)
    for (T& x : want) x = static_cast<T>(x / static_cast<T>(g_size));
  const std::vector<T> got = from_dev(r, n);
  expect(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0,
         std::string(name) + ": differs from MPI_Allreduce (bit for bit)");
  if (!in_place) {
    const std::vector<T> still = from_dev(s, n);
    expect(std::memcmp(still.data(), h.data(), n * sizeof(T)) == 0, std::string(name) + ": sendbuff changed");
  }
  cudaFree(s);
  if (!in_place) cudaFree(r);
}

// The fake reads FAKE_NCCL_TIMEOUT_S at every wait: 1 s for the cases that wait for it, 60 s
// elsewhere (a loaded machine must not turn a slow peer into a failure).
void short_timeout(bool on) { setenv("FAKE_NCCL_TIMEOUT_S", on ? "1" : "60", 1); }

// A value that says who sent it, to whom, and which message of the pair it is.
int32_t mark(int from, int to, int msg, int i) { return from * 1000000 + to * 10000 + msg * 1000 + i; }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int gpus = 0;
  cuda_ok(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  if (gpus < g_size) {
    if (g_rank == 0)
      std::fprintf(stderr, "FAIL: %d ranks need MOETRAIN_EMULATED_GPUS >= %d (have %d)\n", g_size,
                   g_size, gpus);
    MPI_Finalize();
    return 1;
  }
  short_timeout(false);
  const int me = g_rank, n = g_size, right = (me + 1) % n, left = (me + n - 1) % n;
  int version = 0;
  expect_code(ncclGetVersion(&version), ncclSuccess, nullptr, "ncclGetVersion");
  expect(version == NCCL_VERSION_CODE, "ncclGetVersion");
  expect(std::string(ncclGetErrorString(ncclRemoteError)) == "remote process exited or there was a network error",
         "ncclGetErrorString(ncclRemoteError) is NCCL's string");

  // ---- usage without a communicator ----
  expect_code(ncclGroupEnd(), ncclInvalidUsage, "no matching ncclGroupStart", "ncclGroupEnd without ncclGroupStart");
  expect_code(ncclSend(nullptr, 0, ncclFloat32, 0, nullptr, nullptr), ncclInvalidArgument, "comm is NULL",
              "ncclSend on a NULL comm");
  ncclComm_t c = nullptr;
  ncclUniqueId zero{};
  expect_code(ncclCommInitRank(&c, n, zero, me), ncclInvalidArgument, "not made by ncclGetUniqueId",
              "ncclCommInitRank with a zero id");
  expect_code(ncclCommInitRank(nullptr, n, zero, me), ncclInvalidArgument, "comm is NULL",
              "ncclCommInitRank with a NULL comm");
  {
    ncclUniqueId id{};
    expect_code(ncclGetUniqueId(&id), ncclSuccess, nullptr, "ncclGetUniqueId");
    id.internal[9] ^= 0x40;  // a nonce byte
    expect_code(ncclCommInitRank(&c, n, id, me), ncclInvalidArgument, "corrupted",
                "ncclCommInitRank with a corrupted id");
    expect_code(ncclCommInitRank(&c, n, id, n), ncclInvalidArgument, "is not in [0,",
                "ncclCommInitRank with rank == nranks");
    expect_code(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "invalid nranks",
                "ncclCommInitRank with nranks 0");
  }
  // Every rank its own id (the forgotten broadcast): a clear error after FAKE_NCCL_TIMEOUT_S.
  {
    ncclUniqueId own{};
    expect_code(ncclGetUniqueId(&own), ncclSuccess, nullptr, "ncclGetUniqueId");
    short_timeout(true);
    expect_code(ncclCommInitRank(&c, n, own, me), ncclInvalidUsage, "did every rank pass the same id",
                "ncclCommInitRank, every rank its own id");
    short_timeout(false);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Two ranks on one GPU.
  cuda_ok(cudaSetDevice(0), "cudaSetDevice(0)");
  expect_code(ncclCommInitRank(&c, n, shared_id(), me), ncclInvalidUsage, "Duplicate GPU detected",
              "ncclCommInitRank, all ranks on device 0");
  cuda_ok(cudaSetDevice(me), "cudaSetDevice(rank)");

  // ---- a communicator ----
  const ncclUniqueId id = shared_id();
  expect_code(ncclCommInitRank(&c, n, id, me), ncclSuccess, nullptr, "ncclCommInitRank");
  if (!c) {
    std::fprintf(stderr, "FAIL [rank %d] no communicator: stopping\n", me);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int count = 0, rank = -1, dev = -1;
  ncclCommCount(c, &count);
  ncclCommUserRank(c, &rank);
  ncclCommCuDevice(c, &dev);
  expect(count == n && rank == me && dev == me, "ncclCommCount/UserRank/CuDevice");
  ncclComm_t again = nullptr;
  expect_code(ncclCommInitRank(&again, n, id, me), ncclInvalidUsage, "already used",
              "ncclCommInitRank with a used id");

  float* f = dev_alloc<float>(64);
  std::vector<float> host(64, 1.0f);
  expect_code(ncclSend(f, 4, ncclFloat32, n + 3, c, nullptr), ncclInvalidArgument, "is not in [0,",
              "ncclSend to peer nranks + 3");
  expect_code(ncclRecv(f, 4, ncclFloat32, -1, c, nullptr), ncclInvalidArgument, "peer -1",
              "ncclRecv from peer -1");
  expect_code(ncclSend(f, 4, ncclNumTypes, right, c, nullptr), ncclInvalidArgument, "invalid datatype",
              "ncclSend of datatype ncclNumTypes");
  expect_code(ncclAllReduce(f, f, 4, ncclFloat32, ncclNumOps, c, nullptr), ncclInvalidArgument,
              "invalid reduction operation", "ncclAllReduce with op ncclNumOps");
  expect_code(ncclAllReduce(host.data(), f, 4, ncclFloat32, ncclSum, c, nullptr), ncclInvalidArgument,
              "not device memory", "ncclAllReduce of a host buffer");
  expect_code(ncclSend(nullptr, 4, ncclFloat32, right, c, nullptr), ncclInvalidArgument, "is NULL",
              "ncclSend of NULL, count 4");
  expect_code(ncclAllReduce(f, f, 4, ncclBfloat16, ncclSum, c, nullptr), ncclInternalError,
              "does not reduce bfloat16", "ncclAllReduce of bfloat16");

  // ---- all-reduce: bit-identical to MPI_Allreduce on the same ranks ----
  MPI_Comm ref;
  MPI_Comm_dup(MPI_COMM_WORLD, &ref);
  for (size_t len : {size_t{7}, size_t{4099}}) {
    allreduce_case<float>(c, ref, ncclFloat32, MPI_FLOAT, ncclSum, MPI_SUM, len, true, "allreduce float32 sum");
    allreduce_case<float>(c, ref, ncclFloat32, MPI_FLOAT, ncclMax, MPI_MAX, len, false, "allreduce float32 max");
    allreduce_case<int32_t>(c, ref, ncclInt32, MPI_INT32_T, ncclSum, MPI_SUM, len, true, "allreduce int32 sum");
    allreduce_case<int32_t>(c, ref, ncclInt32, MPI_INT32_T, ncclMax, MPI_MAX, len, false, "allreduce int32 max");
    allreduce_case<double>(c, ref, ncclFloat64, MPI_DOUBLE, ncclSum, MPI_SUM, len, true, "allreduce float64 sum");
    allreduce_case<double>(c, ref, ncclFloat64, MPI_DOUBLE, ncclMax, MPI_MAX, len, true, "allreduce float64 max");
    allreduce_case<int64_t>(c, ref, ncclInt64, MPI_INT64_T, ncclSum, MPI_SUM, len, false, "allreduce int64 sum");
    allreduce_case<int64_t>(c, ref, ncclInt64, MPI_INT64_T, ncclMax, MPI_MAX, len, true, "allreduce int64 max");
    allreduce_case<double>(c, ref, ncclFloat64, MPI_DOUBLE, ncclMin, MPI_MIN, len, true, "allreduce float64 min");
    allreduce_case<float>(c, ref, ncclFloat32, MPI_FLOAT, ncclAvg, MPI_SUM, len, true, "allreduce float32 avg");
  }
  // The stream is synchronised first: a queued copy into the buffer is what gets reduced.
  {
    float* s = dev_alloc<float>(3);
    const std::vector<float> v{1.0f + me, 2.0f, 3.0f};
    cuda_ok(cudaMemcpyAsync(s, v.data(), 3 * sizeof(float), cudaMemcpyHostToDevice, nullptr), "cudaMemcpyAsync");
    expect_code(ncclAllReduce(s, s, 3, ncclFloat32, ncclSum, c, nullptr), ncclSuccess, nullptr,
                "ncclAllReduce after a queued copy");
    const std::vector<float> got = from_dev(s, 3);
    expect(got[0] == static_cast<float>(n + n * (n - 1) / 2) && got[1] == 2.0f * n,
           "ncclAllReduce reads what the stream wrote");
    cudaFree(s);
  }

  // ---- grouped send/receive: per pair, matched in issue order ----
  // Every rank sends two messages to every rank (itself included): message 0 of 3 int32, message
  // 1 of 5. The receives are issued before the sends, in the same per-peer order.
  {
    std::vector<int32_t*> sbuf(2 * n), rbuf(2 * n);
    for (int p = 0; p < n; ++p)
      for (int m = 0; m < 2; ++m) {
        const size_t len = m == 0 ? 3 : 5;
        std::vector<int32_t> v(len);
        for (size_t i = 0; i < len; ++i) v[i] = mark(me, p, m, static_cast<int>(i));
        sbuf[2 * p + m] = dev_alloc<int32_t>(len);
        rbuf[2 * p + m] = dev_alloc<int32_t>(len);
        to_dev(sbuf[2 * p + m], v);
      }
    expect_code(ncclGroupStart(), ncclSuccess, nullptr, "ncclGroupStart");
    for (int p = n - 1; p >= 0; --p)
      for (int m = 0; m < 2; ++m)
        expect_code(ncclRecv(rbuf[2 * p + m], m == 0 ? 3 : 5, ncclInt32, p, c, nullptr), ncclSuccess,
                    nullptr, "ncclRecv in a group");
    expect_code(ncclGroupStart(), ncclSuccess, nullptr, "nested ncclGroupStart");
    for (int p = 0; p < n; ++p)
      for (int m = 0; m < 2; ++m)
        expect_code(ncclSend(sbuf[2 * p + m], m == 0 ? 3 : 5, ncclInt32, p, c, nullptr), ncclSuccess,
                    nullptr, "ncclSend in a group");
    expect_code(ncclGroupEnd(), ncclSuccess, nullptr, "inner ncclGroupEnd");
    expect_code(ncclGroupEnd(), ncclSuccess, nullptr, "outer ncclGroupEnd");
    for (int p = 0; p < n; ++p)
      for (int m = 0; m < 2; ++m) {
        const std::vector<int32_t> got = from_dev(rbuf[2 * p + m], m == 0 ? 3 : 5);
        bool ok = true;
        for (size_t i = 0; i < got.size(); ++i) ok &= got[i] == mark(p, me, m, static_cast<int>(i));
        expect(ok, "grouped send/recv: message " + std::to_string(m) + " from peer " + std::to_string(p) +
                       " arrived in order and intact");
      }
    for (auto* b : sbuf) cudaFree(b);
    for (auto* b : rbuf) cudaFree(b);
  }
  // A lone send met by a lone receive (a ring, in two phases so nobody sends and receives at once).
  if (n % 2 == 0) {
    std::vector<float> v{10.0f * me, 1.5f};
    float* s = dev_alloc<float>(2);
    float* r = dev_alloc<float>(2);
    to_dev(s, v);
    for (int phase = 0; phase < 2; ++phase) {
      if (me % 2 == phase) expect_code(ncclSend(s, 2, ncclFloat32, right, c, nullptr), ncclSuccess, nullptr, "lone ncclSend");
      else expect_code(ncclRecv(r, 2, ncclFloat32, left, c, nullptr), ncclSuccess, nullptr, "lone ncclRecv");
    }
    const std::vector<float> got = from_dev(r, 2);
    expect(got[0] == 10.0f * left && got[1] == 1.5f, "lone send/recv delivers");
    cudaFree(s);
    cudaFree(r);
  }
  // Count and datatype mismatches between a send and its receive: the receiver is told.
  {
    float* s = dev_alloc<float>(8);
    float* r = dev_alloc<float>(8);
    ncclGroupStart();
    ncclSend(s, 4, ncclFloat32, right, c, nullptr);
    ncclRecv(r, 8, ncclFloat32, left, c, nullptr);
    expect_code(ncclGroupEnd(), ncclInvalidUsage, "must name the same count and datatype",
                "a receive of 8 met a send of 4");
    ncclGroupStart();
    ncclSend(s, 4, ncclInt32, right, c, nullptr);
    ncclRecv(r, 4, ncclFloat32, left, c, nullptr);
    expect_code(ncclGroupEnd(), ncclInvalidUsage, "met that peer's ncclSend of int32 x 4",
                "a float32 receive met an int32 send");
    // A bad call inside a group aborts the group (on every rank here, so nobody waits).
    expect_code(ncclGroupStart(), ncclSuccess, nullptr, "ncclGroupStart");
    expect_code(ncclSend(s, 4, ncclFloat32, right, c, nullptr), ncclSuccess, nullptr, "ncclSend in a group");
    expect_code(ncclSend(s, 4, ncclFloat32, n, c, nullptr), ncclInvalidArgument, "is not in [0,",
                "ncclSend to peer nranks in a group");
    expect_code(ncclGroupEnd(), ncclInvalidArgument, "aborted", "ncclGroupEnd of an aborted group");
    // ... and the next group runs normally.
    ncclGroupStart();
    ncclSend(s, 4, ncclFloat32, right, c, nullptr);
    ncclRecv(r, 4, ncclFloat32, left, c, nullptr);
    expect_code(ncclGroupEnd(), ncclSuccess, nullptr, "a group after an aborted one");
    // Destroying a communicator with operations waiting in an open group.
    ncclGroupStart();
    ncclSend(s, 2, ncclFloat32, me, c, nullptr);
    expect_code(ncclCommDestroy(c), ncclInvalidUsage, "wait in an open group",
                "ncclCommDestroy with an open group");
    ncclRecv(r, 2, ncclFloat32, me, c, nullptr);
    expect_code(ncclGroupEnd(), ncclSuccess, nullptr, "a send to self and its receive in a group");
    // Lone sends that cross (both ranks send first): NCCL deadlocks; the fake says why.
    if (n == 2) {
      MPI_Barrier(MPI_COMM_WORLD);
      short_timeout(true);
      expect_code(ncclSend(s, 4, ncclFloat32, right, c, nullptr), ncclInvalidUsage,
                  "outside ncclGroupStart/End did not complete", "crossing lone ncclSends");
      short_timeout(false);
      // The abandoned sends are still posted: receive them, so the job ends cleanly (after both
      // ranks gave up: a receive posted earlier would complete the other rank's send).
      MPI_Barrier(MPI_COMM_WORLD);
      expect_code(ncclRecv(r, 4, ncclFloat32, left, c, nullptr), ncclSuccess, nullptr,
                  "lone ncclRecv of the abandoned send");
    }
    cudaFree(s);
    cudaFree(r);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Two communicators rooted on world rank 0, {0, 1} then {0, 2}; rank 1 comes late, so rank 2's
  // join for the second arrives while rank 0 collects the first (kept for later, not lost).
  if (n >= 3) {
    ncclUniqueId a{}, b{};
    if (me == 0) {
      ncclGetUniqueId(&a);
      ncclGetUniqueId(&b);
    }
    MPI_Bcast(&a, sizeof a, MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Bcast(&b, sizeof b, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t ca = nullptr, cb = nullptr;
    if (me == 0) {
      expect_code(ncclCommInitRank(&ca, 2, a, 0), ncclSuccess, nullptr, "ncclCommInitRank {0, 1}");
      expect_code(ncclCommInitRank(&cb, 2, b, 0), ncclSuccess, nullptr, "ncclCommInitRank {0, 2}");
    } else if (me == 1) {
      usleep(300000);
      expect_code(ncclCommInitRank(&ca, 2, a, 1), ncclSuccess, nullptr, "ncclCommInitRank {0, 1}");
    } else if (me == 2) {
      expect_code(ncclCommInitRank(&cb, 2, b, 1), ncclSuccess, nullptr, "ncclCommInitRank {0, 2}");
    }
    for (ncclComm_t x : {ca, cb}) {
      if (!x) continue;
      int32_t* d = dev_alloc<int32_t>(1);
      to_dev(d, std::vector<int32_t>{me + 1});
      expect_code(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, x, nullptr), ncclSuccess, nullptr,
                  "ncclAllReduce on a two-rank communicator");
      expect(from_dev(d, 1)[0] == (x == ca ? 1 + 2 : 1 + 3), "the two-rank communicators have the right members");
      cudaFree(d);
      expect_code(ncclCommDestroy(x), ncclSuccess, nullptr, "ncclCommDestroy");
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_code(ncclCommDestroy(c), ncclSuccess, nullptr, "ncclCommDestroy");
  expect_code(ncclSend(f, 1, ncclFloat32, right, c, nullptr), ncclInvalidArgument, "not a live communicator",
              "ncclSend on a destroyed comm");
  expect_code(ncclCommDestroy(c), ncclInvalidArgument, "not a live communicator", "ncclCommDestroy twice");
  cudaFree(f);

  MPI_Comm_free(&ref);
  int fails = 0;
  MPI_Allreduce(&g_fail, &fails, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) std::printf("%s fake NCCL contract on %d ranks (%d failures)\n", fails ? "FAIL" : "PASS", n, fails);
  MPI_Finalize();
  return fails ? 1 : 0;
}
