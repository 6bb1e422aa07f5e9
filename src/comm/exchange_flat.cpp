// flat: one alltoallv over the group per exchange, each (token, destination) pair's row once.
#include "comm/exchange_internal.h"

namespace moe::comm::exchange_detail {

void return_rows_flat(const ExchangeRun& run, const float* rows, float* ret, int H) {
  const Impl& im = run.im;
  run.group.alltoallv(rows, scaled(im.recv_count, H), scaled(im.recv_off, H), ret,
                      scaled(im.send_count, H), scaled(im.send_off, H));
  if (run.stats)
    for (int s = 0; s < im.n; ++s)
      if (im.recv_count[s]) run.stats->add(im.link_to[s], uint64_t(im.recv_count[s]) * H * sizeof(float));
}

namespace {

class FlatAlgorithm final : public Algorithm {
 public:
  void multicast(const ExchangeRun& run, const float* src, float* recv, int H) const override {
    const Impl& im = run.im;
    Rows sendbuf = run.rows(static_cast<size_t>(im.num_send_pairs) * H);
    if (run.copy_rows)
      for (int p = 0; p < im.num_send_pairs; ++p)
        copy_row(sendbuf.data() + static_cast<int64_t>(p) * H, src + static_cast<int64_t>(im.src_row[p]) * H, H);
    run.group.alltoallv(sendbuf.data(), scaled(im.send_count, H), scaled(im.send_off, H), recv,
                        scaled(im.recv_count, H), scaled(im.recv_off, H));
    if (run.stats)
      for (int d = 0; d < im.n; ++d)
        if (im.send_count[d]) run.stats->add(im.link_to[d], uint64_t(im.send_count[d]) * H * sizeof(float));
  }

  void return_rows(const ExchangeRun& run, const float* rows, float* ret, int H) const override {
    return_rows_flat(run, rows, ret, H);
  }
};

}  // namespace

const Algorithm& flat_algorithm() {
  static const FlatAlgorithm algo;
  return algo;
}

}  // namespace moe::comm::exchange_detail
