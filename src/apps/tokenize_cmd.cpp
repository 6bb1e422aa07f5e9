// `moetrain tokenize` (see tokenize_cmd.h).
#include "apps/tokenize_cmd.h"

#include "core/error.h"
#include "train/run_guard.h"

namespace moe::apps {

void add_tokenize_command(CLI::App& app, TokenizeCli& s) {
  CLI::App* t = app.add_subcommand("tokenize", "text files -> Megatron indexed dataset (PREFIX.bin + PREFIX.idx)");
  t->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  t->add_option("--input", s.opts.inputs, "text files (one or more)")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  t->add_option("--tokenizer", s.opts.tokenizer, "bytes, bpe:VOCAB (train a SentencePiece BPE) or spm:MODEL")
      ->capture_default_str();
  t->add_option("--output", s.opts.output, "output PREFIX (writes PREFIX.bin, .idx, .tokenizer.json[, .model])")
      ->required();
  t->add_option("--docs", s.opts.docs, "document boundaries: paragraph (blank lines), line or file")
      ->capture_default_str();
  t->add_flag("--quiet", s.quiet, "no summary line");
}

int run_tokenize_command(CLI::App& app, TokenizeCli& s) {
  if (!app.got_subcommand("tokenize")) return -1;
  // Started once per rank, every copy would write the same files at the same time.
  const int ranks = train::launcher_world_size();
  if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
  MOE_CHECK(ranks == 1, "tokenize writes one dataset from one process, but this is one of ", ranks,
            " ranks started by a launcher (mpirun/srun): run `moetrain tokenize` without it");
  s.opts.progress = !s.quiet;
  text::run_tokenize(s.opts);
  return 0;
}

}  // namespace moe::apps
