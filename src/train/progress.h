// What a run prints on stderr (the root rank, unless --quiet): the header before the first step,
// one progress line per step (rewritten in place on a terminal; on a pipe the first, every 20th,
// evaluation and last steps), and the line that ends a finished run.
#pragma once
#include <string>
#include <vector>

#include "comm/nccl.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "train/mfu_peak.h"
#include "train/run_setup.h"
#include "train/trainer.h"

namespace moe::train {

// The model, the batch, the layout and its exchange, the device, the BLAS, the MFU peak, and the
// notes on --a2a auto, --comm.overlap and --precision auto. steps_text: "N steps" or the budget's.
// "--init-from DIR: held-out loss X before the first step"
void print_init_from_loss(const std::string& dir, double loss);
void print_run_header(const TrainOptions& opts, const RunSetup& setup, const parallel::Grid& grid,
                      const std::vector<int>& layers_per_stage, const std::string& steps_text, const MfuPeak& peak,
                      CommBackend backend, const std::string& backend_why);

// One step's line. total_text: the step count ("?" before --time-budget chose it); val_loss NaN
// off evaluation steps; bytes_per_token > 0 adds the held-out loss per byte (tokenized data).
struct ProgressLine {
  int step = 0;  // 0-based
  std::string total_text;
  bool last = false;
  model::LossParts loss;
  double tokens_per_s = 0, mfu = 0, a2a_share = 0, bubble = 0, eta_s = 0;
  double val_loss = NAN, bytes_per_token = 0;
};
void print_progress(const ProgressLine& p, bool tty);

// "done: N steps in ..., tokens/s, MFU, final val loss ...; wrote ...". The held-out loss is per
// byte for byte-level text, per token and per byte for tokenized data with a known bytes/token.
void print_done(const TrainOptions& opts, int steps, double seconds, double train_s, const TrainResult& res,
                bool tokenized, double bytes_per_token);

}  // namespace moe::train
