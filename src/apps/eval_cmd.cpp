#include "apps/eval_cmd.h"

#include <cstdio>
#include <vector>

#include "apps/cli_checks.h"
#include "core/error.h"
#include "io/corpus.h"
#include "io/indexed_dataset.h"
#include "io/output_file.h"
#include "io/token_corpus.h"
#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "train/generate.h"
#include "train/run_guard.h"
#include "train/trainer.h"

namespace moe::apps {

void add_eval_command(CLI::App& app, EvalCli& s) {
  CLI::App* e = add_command(
      app, "eval", "held-out loss of a trained model on a corpus's validation split (the trainer's val_loss)");
  add_model_argument(e, s.model_path);
  e->add_option("--data", s.data_path, "text file or indexed dataset PREFIX (default: data/kjv.txt)");
  e->add_option("--batch", s.batch, "sequences per validation batch (the run's global batch)")->capture_default_str();
  e->add_option("--seq-len", s.seq_len, "tokens per sequence")->capture_default_str();
  e->add_option("--eval-batches", s.eval_batches, "validation batches")->capture_default_str();
  e->add_option("--threads", s.threads, "BLAS threads")->capture_default_str();
  e->add_option("--dump", s.dump_path,
                "also write the windows (tokens [N, T+1]) and the loss (ce) to this .safetensors file");
}

int run_eval_command(CLI::App& app, EvalCli& s) {
  if (!app.got_subcommand("eval")) return -1;
  MOE_CHECK(s.threads >= 1 && s.threads <= 1024, "--threads must be in [1, 1024], got ", s.threads);
  MOE_CHECK(s.batch >= 1 && s.batch <= (1 << 20), "--batch must be in [1, 1048576], got ", s.batch);
  MOE_CHECK(s.seq_len >= 1 && s.seq_len <= (1 << 20), "--seq-len must be in [1, 1048576], got ", s.seq_len);
  MOE_CHECK(s.eval_batches >= 1 && s.eval_batches <= (1 << 20), "--eval-batches must be in [1, 1048576], got ",
            s.eval_batches);
  const int ranks = train::launcher_world_size();
  if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
  MOE_CHECK(ranks == 1, "eval runs in one process, but this is one of ", ranks,
            " ranks started by a launcher (mpirun/srun): run `moetrain eval` without it");
  kernels::set_blas_threads(s.threads);
  const std::string data_path = s.data_path.empty() ? train::default_corpus_path() : s.data_path;
  const bool indexed = io::is_indexed_dataset(data_path);
  // The run's inputs: the model folder (every file directly in it) and the data's files. --dump
  // is none of them, and a new or regular file (io/output_file.h), checked before any work.
  std::vector<std::string> inputs = {s.model_path};
  if (indexed) {
    const std::string prefix = io::indexed_prefix(data_path);
    inputs.insert(inputs.end(), {io::idx_path(prefix), io::bin_path(prefix), io::tokenizer_info_path(prefix)});
  } else {
    inputs.push_back(data_path);
  }
  if (!s.dump_path.empty()) io::check_output_path(s.dump_path, "--dump", inputs);
  train::LoadedModel lm = train::load_model_for_inference(s.model_path);
  inputs.push_back(lm.folder);  // a folder of checkpoints resolves to its newest step-N
  model::Model& m = *lm.model;
  const model::ModelConfig& cfg = m.config();
  MOE_CHECK(s.seq_len <= cfg.max_position_embeddings, "--seq-len ", s.seq_len,
            " exceeds the model's max_position_embeddings ", cfg.max_position_embeddings, " (", lm.source, ")");
  if (!s.dump_path.empty()) io::check_output_path(s.dump_path, "--dump", inputs);
  MOE_CHECK(indexed || cfg.vocab_size >= 256, "byte-level data needs vocab_size >= 256, the model (",
            lm.source, ") has ", cfg.vocab_size);
  if (indexed) {
    train::check_regular_input(io::idx_path(io::indexed_prefix(data_path)), "--data");
    train::check_regular_input(io::bin_path(io::indexed_prefix(data_path)), "--data");
  } else {
    train::check_regular_input(data_path, "--data");
  }
  std::unique_ptr<io::Corpus> corpus = io::open_corpus(data_path, cfg.vocab_size);
  // The data's tokenizer must be the model's (issue 42, class 4): another one's ids mean other text.
  const std::string note = io::check_tokenizer_match(cfg.tokenizer_fingerprint, lm.source,
                                                     corpus->tokenizer_fingerprint(), str_cat("--data ", data_path));
  if (!note.empty()) std::fprintf(stderr, "moetrain: %s\n", note.c_str());
  const int B = s.batch, T = s.seq_len, n = s.eval_batches;
  // The trainer's windows: val_batches of the global batch, evaluated batch by batch and averaged
  // (batches of equal size, so this is the mean over every window's tokens).
  const std::vector<int32_t> val = corpus->val_batches(B, T, n);
  const size_t per_batch = static_cast<size_t>(B) * (T + 1);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += m.evaluate(val.data() + i * per_batch, B, T).ce;
  const double ce = sum / n;
  const double bytes_per_token = corpus->val_bytes_per_token();
  std::printf("%s on %s: held-out loss %.6f nats/token", lm.source.c_str(), data_path.c_str(), ce);
  if (bytes_per_token != 1.0 && bytes_per_token > 0) std::printf(", %.6f nats/byte", ce / bytes_per_token);
  else if (bytes_per_token == 1.0) std::printf(" (= nats/byte)");
  std::printf(" over %d x %d windows of %d tokens\n", n, B, T);
  if (!s.dump_path.empty()) {
    io::SafetensorsWriter w;
    w.add_i32("tokens", {static_cast<int64_t>(n) * B, T + 1}, val.data());
    const float ce32 = static_cast<float>(ce);
    w.add_f32("ce", {1}, &ce32);
    w.write(s.dump_path, "--dump");
  }
  return 0;
}

}  // namespace moe::apps
