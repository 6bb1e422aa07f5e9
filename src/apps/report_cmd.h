// `moetrain report RUN_DIR [-o report.html]`: one self-contained HTML page (inline SVG, no
// script, no network) of a training run's metrics.jsonl: losses against step and wall time,
// tokens/s and MFU, the step-time distribution with its outliers, the all-to-all share and bytes
// by link class, expert load per (layer, expert) over time, the pipeline bubble per stage, and with
// expert parallelism the EP-rank balance and the expert migrations. The lines are read through the
// metrics schema (train/step_record.h).
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

// The page for a metrics file (metrics_path) of a run folder (run_dir: config.json is read from
// it when present, as a plain file inside the folder). metrics_in_folder: the metrics file was
// found in the run folder (a symbolic link there is refused). Throws moe::Error naming the file
// and line of a bad record.
std::string render_report(const std::string& run_dir, const std::string& metrics_path, bool metrics_in_folder = false);

}  // namespace moe::apps
