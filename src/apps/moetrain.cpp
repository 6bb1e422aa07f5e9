// moetrain: the command-line entry point. Thin: each command's flags and its one call into the
// library live in apps/<command>_cmd.cpp; this file registers them and runs the one chosen.
// Any moe::Error (bad flag value, bad file, bad config) is printed as one line and exits 1.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <type_traits>

#include "apps/bench_cmd.h"
#include "apps/eval_cmd.h"
#include "apps/export_cmd.h"
#include "apps/generate_cmd.h"
#include "apps/inspect_cmd.h"
#include "apps/plan_cmd.h"
#include "apps/report_cmd.h"
#include "apps/tokenize_cmd.h"
#include "apps/train_cmd.h"
#include "apps/upcycle_cmd.h"
#include "core/device.h"
#include "core/error.h"
#include "train/run_guard.h"
#include "kernels/gemm.h"

using namespace moe;

namespace {

// One command: add registers its flags, run runs it when it was chosen (else -1). Both reach the
// same state, owned here.
struct Command {
  std::function<void(CLI::App&)> add;
  std::function<int(CLI::App&, int*, char***)> run;
};

// Commands that start MPI take the process's arguments; the others only their state.
template <class Cli, class Run>
Command command(void (*add)(CLI::App&, Cli&), Run run) {
  auto state = std::make_shared<Cli>();
  return {[=](CLI::App& app) { add(app, *state); },
          [=](CLI::App& app, int* argc, char*** argv) {
            if constexpr (std::is_invocable_v<Run, CLI::App&, Cli&, int*, char***>)
              return run(app, *state, argc, argv);
            else
              return run(app, *state);
          }};
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) must make a write fail with an error we report, not kill us.
  std::signal(SIGXFSZ, SIG_IGN);
  kernels::ensure_blas_kernels(argv);  // may re-execute this program with OPENBLAS_CORETYPE set
  keep_host_heap();                    // buffers freed each micro-batch are reused, not refaulted
  CLI::App app{"moetrain: train DeepSeek-style Mixture-of-Experts models"};
  app.require_subcommand(0, 1);
  // In --help's order; each command keeps its flags' state and runs only when it was chosen.
  const Command commands[] = {
      command(apps::add_train_command, apps::run_train_command),
      command(apps::add_bench_command, apps::run_bench_command),
      command(apps::add_plan_commands, apps::run_plan_commands),
      command(apps::add_report_command, apps::run_report_command),
      command(apps::add_inspect_command, apps::run_inspect_command),
      command(apps::add_generate_command, apps::run_generate_command),
      command(apps::add_eval_command, apps::run_eval_command),
      command(apps::add_tokenize_command, apps::run_tokenize_command),
      command(apps::add_upcycle_command, apps::run_upcycle_command),
      command(apps::add_export_command, apps::run_export_command),
  };
  for (const Command& c : commands) c.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moetrain: error: %s (see --help)\n", e.what());
    return e.get_exit_code() == 0 ? 2 : e.get_exit_code();
  } catch (const Error& e) {
    // A mode's word refused by its parser (apps/mode_option.h). Every rank of a launched job
    // parses the same flags: the first one says why, once.
    if (train::launcher_world_rank() == 0) std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  }
  try {
    if (app.get_subcommands().empty()) {
      std::printf("%s", app.help().c_str());
      return 0;
    }
    for (const Command& c : commands)
      if (int rc = c.run(app, &argc, &argv); rc >= 0) return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
