// `moetrain report`: flags -> report::write_report. See report_cmd.h.
#include "apps/report_cmd.h"

#include <cstdio>

#include "report/report.h"

namespace moe::apps {

void add_report_command(CLI::App& app, ReportCli& s) {
  CLI::App* r = app.add_subcommand("report", "a training run's metrics -> one self-contained HTML page of plots");
  r->add_option("run", s.run, "the --out folder of moetrain train (or its metrics.jsonl)")->required();
  r->add_option("-o,--output", s.output, "HTML file to write (default RUN/report.html)");
}

int run_report_command(CLI::App& app, const ReportCli& s) {
  if (!app.got_subcommand("report")) return -1;
  const report::ReportWritten w = report::write_report(s.run, s.output);
  std::printf("wrote %s (%zu KB) from %s\n", w.path.c_str(), w.bytes / 1024, w.metrics.c_str());
  return 0;
}

}  // namespace moe::apps
