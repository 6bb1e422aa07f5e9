// The report of a training run: one self-contained HTML page (inline SVG, no script, no network)
// of a run's metrics.jsonl: losses against step and wall time, tokens/s and MFU, the step-time
// distribution with its outliers, the all-to-all share and bytes by link class, expert load per
// (layer, expert) over time, the pipeline bubble per stage, and with expert parallelism the
// EP-rank balance and the expert migrations. The lines are read through the metrics schema
// (train/step_record.h, report/metrics_run.h).
#pragma once
#include <cstddef>
#include <string>

namespace moe::report {

// The page for a metrics file (metrics_path) of a run folder (run_dir: config.json is read from
// it when present, as a plain file inside the folder). metrics_in_folder: the metrics file was
// found in the run folder (a symbolic link there is refused). Throws moe::Error naming the file
// and line of a bad record.
std::string render_report(const std::string& run_dir, const std::string& metrics_path, bool metrics_in_folder = false);

// `moetrain report RUN [-o OUT]`: RUN is the --out folder of `moetrain train` or a metrics file;
// OUT defaults to RUN/report.html. The page never replaces a file it is made from and is written
// under a temporary name and renamed (io/output_file.h).
struct ReportWritten {
  std::string path, metrics;  // the page written, the metrics it was made from
  size_t bytes = 0;
};
ReportWritten write_report(const std::string& run, const std::string& output);

}  // namespace moe::report
