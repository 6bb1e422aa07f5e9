// moetrain: the command-line entry point. Thin: each command's flags and its one call into the
// library live in apps/<command>_cmd.cpp; this file registers them and runs the one chosen.
// Any moe::Error (bad flag value, bad file, bad config) is printed as one line and exits 1.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>

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

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) must make a write fail with an error we report, not kill us.
  std::signal(SIGXFSZ, SIG_IGN);
  kernels::ensure_blas_kernels(argv);  // may re-execute this program with OPENBLAS_CORETYPE set
  keep_host_heap();                    // buffers freed each micro-batch are reused, not refaulted
  CLI::App app{"moetrain: train DeepSeek-style Mixture-of-Experts models"};
  app.require_subcommand(0, 1);
  apps::TrainCli train_cli;
  apps::add_train_command(app, train_cli);
  apps::BenchCli bench_cli;
  apps::add_bench_command(app, bench_cli);
  apps::PlanCli plan_cli;
  apps::add_plan_commands(app, plan_cli);
  apps::ReportCli report_cli;
  apps::add_report_command(app, report_cli);
  apps::InspectCli inspect_cli;
  apps::add_inspect_command(app, inspect_cli);
  apps::GenerateCli generate_cli;
  apps::add_generate_command(app, generate_cli);
  apps::EvalCli eval_cli;
  apps::add_eval_command(app, eval_cli);
  apps::TokenizeCli tokenize_cli;
  apps::add_tokenize_command(app, tokenize_cli);
  train::UpcycleOptions upcycle_cli;
  apps::add_upcycle_command(app, upcycle_cli);
  apps::ExportCli export_cli;
  apps::add_export_command(app, export_cli);
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
    if (int rc = apps::run_plan_commands(app, plan_cli, &argc, &argv); rc >= 0) return rc;
    if (int rc = apps::run_report_command(app, report_cli); rc >= 0) return rc;
    if (int rc = apps::run_inspect_command(app, inspect_cli); rc >= 0) return rc;
    if (int rc = apps::run_generate_command(app, generate_cli); rc >= 0) return rc;
    if (int rc = apps::run_eval_command(app, eval_cli); rc >= 0) return rc;
    if (int rc = apps::run_tokenize_command(app, tokenize_cli); rc >= 0) return rc;
    if (int rc = apps::run_upcycle_command(app, upcycle_cli); rc >= 0) return rc;
    if (int rc = apps::run_bench_command(app, bench_cli, &argc, &argv); rc >= 0) return rc;
    if (int rc = apps::run_export_command(app, export_cli); rc >= 0) return rc;
    if (int rc = apps::run_train_command(app, train_cli, &argc, &argv); rc >= 0) return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
