#include "apps/generate_cmd.h"

#include <cstdio>

#include "apps/cli_checks.h"
#include "apps/mode_option.h"
#include "core/error.h"
#include "io/json_file.h"
#include "io/token_corpus.h"
#include "io/tokenizer.h"
#include "text/tokenizer.h"
#include "kernels/gemm.h"
#include "train/run_guard.h"

namespace moe::apps {

namespace {
// Seeds: CLI11 would read "-1" as 2^64 - 1; checked on the text instead (as train's --seed).
const CLI::Validator kSeed(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      return digits && v.size() <= 20 ? std::string() : str_cat("must be a non-negative integer, got ", v);
    },
    "INT>=0");
}  // namespace

void add_generate_command(CLI::App& app, GenerateCli& s) {
  train::GenerateOptions& o = s.opts;
  CLI::App* g = add_command(
      app, "generate", "text from a trained model (a checkpoint or an exported folder), KV-cached decoding");
  add_model_argument(g, o.model_path);
  g->add_option("--prompt", o.prompt, "the text to continue")->required();
  g->add_option("--tokens", o.tokens, "new tokens (prompt + tokens <= max_position_embeddings)")
      ->capture_default_str();
  g->add_option("--temperature", o.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  g->add_option("--top-k", o.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  g->add_option("--seed", o.seed, "sampler seed")->capture_default_str()->check(kSeed);
  add_mode_option(g, "--device", o.device, "cpu or cuda");
  g->add_option("--tokenizer", o.tokenizer,
                "bytes, or spm:PATH.model (the SentencePiece model `moetrain tokenize` wrote beside the dataset)")
      ->capture_default_str();
  g->add_option("--threads", s.threads, "BLAS threads")->capture_default_str();
  g->add_flag("--ids", s.ids, "print token ids (prompt, then the new ones) instead of text");
}

int run_generate_command(CLI::App& app, GenerateCli& s) {
  if (!app.got_subcommand("generate")) return -1;
  MOE_CHECK(s.threads >= 1 && s.threads <= 1024, "--threads must be in [1, 1024], got ", s.threads);
  // Started once per rank, every copy would print the same text.
  const int ranks = train::launcher_world_size();
  if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
  MOE_CHECK(ranks == 1, "generate runs in one process, but this is one of ", ranks,
            " ranks started by a launcher (mpirun/srun): run `moetrain generate` without it");
  kernels::set_blas_threads(s.threads);
  s.opts.tokenizer_impl = text::load_tokenizer(s.opts.tokenizer);  // bytes, or SentencePiece (text/)
  const std::shared_ptr<const io::Tokenizer> tok = s.opts.tokenizer_impl;
  // Text streams out as it is generated; nothing is printed before every check has passed.
  bool first = true;
  auto put = [&](int32_t id) {
    if (s.ids) {
      std::printf(first ? "%d" : " %d", id);
    } else {
      const std::string text = tok->decode_token(id);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    first = false;
  };
  auto on_prompt = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) put(id);
    std::fflush(stdout);
  };
  auto on_token = [&](int32_t id) {
    put(id);
    std::fflush(stdout);
  };
  train::generate(s.opts, on_prompt, on_token);
  std::printf("\n");
  return 0;
}

}  // namespace moe::apps
