// `moetrain eval MODEL`: the held-out loss of a trained model on a corpus's validation split, the
// same fixed windows and the same figure (nats per byte) as the trainer's `val_loss`, so a model
// exported by one run is scored again by anyone. `--dump FILE` also writes the windows and the
// loss as safetensors, for the independent PyTorch model (tests/reference/eval_hf.py) to recompute.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moe::apps {

struct EvalCli {
  std::string model_path;  // checkpoint, folder of checkpoints, or exported folder (as generate)
  std::string data_path;   // default: the built-in corpus
  int batch = 16;          // the trainer's global batch (sequences per window set)
  int seq_len = 128;
  int eval_batches = 8;
  int threads = 1;
  std::string dump_path;
};

void add_eval_command(CLI::App& app, EvalCli& state);
// Runs eval when it was chosen (returns the exit code); -1 otherwise. Errors propagate as
// moe::Error (one line from the caller).
int run_eval_command(CLI::App& app, EvalCli& state);

}  // namespace moe::apps
