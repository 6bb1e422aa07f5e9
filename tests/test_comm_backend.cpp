// The choice of the transport for device buffers between ranks (comm/nccl.h): a pure function of
// every rank's (host, GPU), the request and whether NCCL loads.
#include <gtest/gtest.h>

#include "comm/nccl.h"
#include "core/error.h"

namespace moe::comm {
namespace {

using Gpus = std::vector<std::pair<double, int>>;

TEST(CommBackend, AutoPicksNcclOnlyWhenEveryRankHasItsOwnGpu) {
  std::string why;
  // Two hosts, two GPUs each, every rank on its own.
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {1, 1}, {2, 0}, {2, 1}}, true, &why),
            CommBackend::kNccl);
  EXPECT_EQ(why, "every rank has its own GPU");
  // Two ranks on GPU 0 of one host (the one-GPU machine): MPI, and the reason names them.
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {1, 0}}, true, &why), CommBackend::kMpi);
  EXPECT_NE(why.find("ranks 0 and 1 share GPU 0"), std::string::npos) << why;
  // GPU 0 of two different hosts is two GPUs.
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {2, 0}}, true, &why), CommBackend::kNccl);
  // A CPU rank, one rank, or no library: MPI.
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {1, -1}}, true, &why), CommBackend::kMpi);
  EXPECT_NE(why.find("rank 1 has no GPU"), std::string::npos) << why;
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}}, true, &why), CommBackend::kMpi);
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {1, 1}}, false, &why), CommBackend::kMpi);
  EXPECT_EQ(why, "NCCL is not available");
  // The library's own reason is carried into the log line and the error.
  EXPECT_EQ(choose_comm_backend(std::nullopt, {{1, 0}, {1, 1}}, false, &why,
                                "libnccl.so.2: cannot open shared object file"),
            CommBackend::kMpi);
  EXPECT_EQ(why, "NCCL is not available: libnccl.so.2: cannot open shared object file");
  try {
    choose_comm_backend(CommBackend::kNccl, {{1, 0}, {1, 1}}, false, &why, "no libnccl.so.2");
    FAIL() << "nccl accepted without the library";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL is not available: no libnccl.so.2"), std::string::npos)
        << e.what();
  }
}

TEST(CommBackend, ExplicitRequests) {
  std::string why;
  EXPECT_EQ(choose_comm_backend(CommBackend::kMpi, {{1, 0}, {1, 1}}, true, &why), CommBackend::kMpi);
  EXPECT_EQ(choose_comm_backend(CommBackend::kNccl, {{1, 0}, {1, 1}}, true, &why), CommBackend::kNccl);
  try {
    choose_comm_backend(CommBackend::kNccl, {{1, 3}, {1, 3}}, true, &why);
    FAIL() << "two ranks on one GPU accepted for nccl";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--comm.backend nccl: ranks 0 and 1 share GPU 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_comm_backend_or_auto("gloo", "--comm.backend"), Error);
  EXPECT_EQ(parse_comm_backend_or_auto("auto", "x"), std::nullopt);
  EXPECT_EQ(parse_comm_backend_or_auto("nccl", "x"), CommBackend::kNccl);
}

TEST(CommBackend, NcclNotLoadableWithoutTheRealBackend) {
  std::string why;
#if !defined(MOETRAIN_HAVE_CUDA)
  EXPECT_FALSE(nccl_loadable(&why));
  EXPECT_NE(why.find("without the CUDA backend"), std::string::npos);
#elif defined(MOETRAIN_EMULATED_CUDA)
  // The emulated device loads only the fake NCCL (tests/fake_nccl, found through LD_LIBRARY_PATH
  // by tests/emulated_nccl.sh); a real libnccl.so.2, or none, is refused with the reason.
  if (!nccl_loadable(&why)) {
    EXPECT_TRUE(why.find("real NCCL") != std::string::npos ||
                why.find("could not be opened") != std::string::npos)
        << why;
  }
#else
  // With the CUDA backend the answer depends on the machine; it must not throw, and says why not.
  if (!nccl_loadable(&why)) EXPECT_FALSE(why.empty());
#endif
}

}  // namespace
}  // namespace moe::comm
