// `moetrain tokenize` (see tokenize_cmd.h).
#include "apps/tokenize_cmd.h"

#include <filesystem>

#include "apps/cli_checks.h"
#include "core/error.h"
#include "io/corpus.h"
#include "io/output_file.h"
#include "train/run_guard.h"

namespace moe::apps {

void add_tokenize_command(CLI::App& app, TokenizeCli& s) {
  CLI::App* t = add_command(app, "tokenize", "text files -> Megatron indexed dataset (PREFIX.bin + PREFIX.idx)");
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
  // One writer per dataset: PREFIX.lock held until this process ends (train's --out lock), so a
  // second tokenize onto the prefix is refused with this one's pid instead of mixing two inputs.
  const std::string prefix = io::indexed_prefix(s.opts.output);
  MOE_CHECK(!prefix.empty(), "--output must not be empty");
  const std::string dir = std::filesystem::path(prefix).parent_path().string();
  std::error_code ec;
  MOE_CHECK(dir.empty() || std::filesystem::is_directory(dir, ec), "--output ", s.opts.output, ": folder ", dir,
            " does not exist");
  io::check_output_path(prefix + ".lock", "--output", s.opts.inputs);  // its holder line is written
  const train::DirLock lock = train::DirLock::acquire_file(
      prefix + ".lock", prefix, "--output", str_cat("moetrain tokenize --output ", s.opts.output));
  // SIGTERM / SIGINT: the temporary files go, the dataset stays as it was (exit 128 + signal).
  io::install_temp_cleanup_on_signal();
  text::run_tokenize(s.opts);
  return 0;
}

}  // namespace moe::apps
