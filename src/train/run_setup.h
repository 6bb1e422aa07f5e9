// A run's setup: everything bad input can break, checked on every rank before anything large is
// allocated or any output is touched, then agreed on (one rank reports, every rank stops: a
// SetupError). It parses the options' enumerated values once, loads the model config, opens the
// corpus, checks the memory estimate against every rank of each host, takes the output folders'
// locks, finds and checks the checkpoint to resume, and only then opens metrics.jsonl.
#pragma once
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "comm/group.h"
#include "comm/nccl.h"
#include "core/device.h"
#include "io/corpus.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/schedule.h"
#include "train/run_guard.h"
#include "train/trainer.h"

namespace moe::train {

struct RunSetup {
  comm::Group world;
  std::optional<comm::CommTimeout> comm_timeout;  // --comm.timeout, while the run lasts
  std::vector<double> host_of;                    // per world rank: its host (ranks whose memory adds up)
  bool root = false;                              // world rank 0: reports, writes the files
  model::ModelConfig cfg;                         // --preset / --config, --vocab-size applied
  std::unique_ptr<io::Corpus> corpus;             // byte-level text or an indexed dataset
  std::ofstream metrics;                          // metrics.jsonl (root only)
  DirLock out_lock, ckpt_lock;                    // held until the run ends (root only)
  std::string ckpt_dir;                           // --checkpoint.dir or <out>/checkpoints
  std::string resume_path;                        // the checkpoint to resume ("" = a fresh run)
  // The options' enumerated values, parsed.
  A2a a2a = A2a::kFlat;
  std::string a2a_auto_why;                 // --a2a auto: what was chosen and why ("" otherwise)
  std::optional<CommBackend> comm_backend;  // --comm.backend (nullopt = auto): decided with the grid
  Schedule schedule = Schedule::k1F1B;
  Recompute recompute = Recompute::kNone;
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;  // --precision with auto resolved
  // --precision auto on the CPU: the two peaks it compared (GFLOP/s, this rank), 0 otherwise;
  // the chosen one is the run's MFU peak (not measured again).
  double auto_fp32_peak = 0, auto_bf16_peak = 0;
};

// --precision auto picks bf16 on a CPU whose measured bf16 GEMM peak is at least this many times
// its fp32 peak (on every rank); otherwise, and on CUDA, fp32.
constexpr double kAutoBf16MinGain = 1.3;

// Collective over MPI_COMM_WORLD. Throws SetupError (every rank, one reporting) on bad input.
std::unique_ptr<RunSetup> setup_run(const TrainOptions& opts);

// Collective: every rank passes its error ("" = none); when any has one, every rank throws a
// SetupError that the lowest failing rank reports.
void agree(const comm::Group& world, const std::string& error);

// Set by the stop handlers (install_stop_handlers): finish the step, checkpoint, return.
extern volatile std::sig_atomic_t g_stop_requested;

}  // namespace moe::train
