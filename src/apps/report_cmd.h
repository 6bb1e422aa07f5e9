// `moetrain report RUN_DIR [-o report.html]`: the CLI of report/report.h.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moe::apps {

struct ReportCli {
  std::string run;     // the --out folder of `moetrain train`, or a metrics.jsonl file
  std::string output;  // default RUN_DIR/report.html
};
void add_report_command(CLI::App& app, ReportCli& state);
// Runs report when it was chosen (returns the exit code); -1 otherwise. Errors are moe::Error.
int run_report_command(CLI::App& app, const ReportCli& state);

}  // namespace moe::apps
