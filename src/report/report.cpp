// `moetrain report`: metrics.jsonl -> one self-contained HTML page. See report.h.
//
// What it reads: metrics.jsonl, one step record per line, through the schema the trainer writes
// with (train::StepRecord, src/train/step_record.h; its fields: docs/metrics.md). Fields a file
// lacks (older runs) read as absent and the section that needs them says so in a line or is left
// out; a line with an "event" field (no moetrain writes one) is counted and not shown.
// Migrations come from the step records' "migration" (after step N: before N + 1), the balance
// section from "rank_loads" / "load_imbalance" (runs with --ep > 1).
// A resumed run appends to the same file, so step numbers can repeat: the later record wins.
// A last line without its newline that does not parse (the run was killed mid-write) is left out
// and the page says so; any other bad line is an error naming the file and the line.
#include "report/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "report/svg_plot.h"
#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "io/output_file.h"
#include "model/config.h"
#include "report/metrics_run.h"
#include "train/step_record.h"

namespace moe::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The heatmap draws at most this many cells (rows = layer x expert, columns = time buckets).
constexpr size_t kMaxHeatmapCells = 120000;
constexpr int kMaxHeatmapColumns = 60;
constexpr const auto& kLinkClasses = train::kLinkClassNames;

// Nearest-rank percentile of sorted values, p in [0, 1].
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return NAN;
  const size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, i == 0 ? 0 : i - 1)];
}

std::string fmt(double v, const char* f = "%.4g") {
  if (!std::isfinite(v)) return "n/a";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string fmt_bytes(double b) {
  if (!std::isfinite(b)) return "n/a";
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  return fmt(b, i == 0 ? "%.0f" : "%.2f") + " " + u[i];
}

std::string fmt_seconds(double s) {
  if (!std::isfinite(s)) return "n/a";
  if (s < 1) return fmt(s * 1e3, "%.1f") + " ms";
  if (s < 120) return fmt(s, "%.2f") + " s";
  const long t = std::lround(s);
  char b[64];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  return b;
}

// Mean of the finite values; NaN when there are none.
double mean(const std::vector<double>& v) {
  double s = 0;
  int n = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x, ++n;
  return n ? s / n : NAN;
}

bool any_finite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// Mean over a trailing window of n finite values (the smoothed line beside a noisy one).
std::vector<double> rolling_mean(const std::vector<double>& v, int n) {
  std::vector<double> out(v.size(), NAN);
  double s = 0;
  int k = 0;
  std::vector<double> win;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) {
      win.push_back(v[i]);
      s += v[i];
      ++k;
      if (k > n) s -= win[win.size() - 1 - n], --k;
    }
    if (k > 0) out[i] = s / k;
  }
  return out;
}

// A noisy per-step series beside its mean over 20 steps, y from zero.
std::string smoothed_chart(svg::Axes a, const char* label, const std::vector<double>& step,
                           const std::vector<double>& y) {
  a.y_from_zero = true;
  return svg::line_chart(a, {{label, step, y}, {"mean of 20 steps", step, rolling_mean(y, 20)}});
}

struct Page {
  std::string body;
  void h2(const std::string& id, const std::string& t) { body += str_cat("<h2 id=\"", id, "\">", svg::escape(t), "</h2>\n"); }
  void p(const std::string& t) { body += str_cat("<p>", t, "</p>\n"); }
  void none(const std::string& t) { body += str_cat("<p class=\"none\">", svg::escape(t), "</p>\n"); }
  void plot(const std::string& svg) { body += str_cat("<div class=\"fig\">", svg, "</div>\n"); }
  void table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
    body += "<table><tr>";
    for (const auto& h : head) body += str_cat("<th>", svg::escape(h), "</th>");
    body += "</tr>\n";
    for (const auto& r : rows) {
      body += "<tr>";
      for (const auto& c : r) body += str_cat("<td>", svg::escape(c), "</td>");
      body += "</tr>\n";
    }
    body += "</table>\n";
  }
};

void section_summary(Page& pg, const Run& run, const std::vector<const Rec*>& rs, const std::string& run_dir) {
  const Rec& last = *rs.back();
  std::vector<std::vector<std::string>> rows;
  double tokens = 0, time = 0;
  int skipped = 0;
  std::vector<double> mfu;
  for (const Rec* r : rs) {
    if (std::isfinite(r->m.tokens) && std::isfinite(r->m.step_time_s)) tokens += r->m.tokens, time += r->m.step_time_s;
    if (!std::isfinite(r->m.loss)) ++skipped;
    mfu.push_back(r->m.mfu);
  }
  double final_val = NAN, best_val = NAN;
  int best_val_step = 0;
  for (const Rec* r : rs)
    if (std::isfinite(r->m.val_loss)) {
      final_val = r->m.val_loss;
      if (!(r->m.val_loss >= best_val)) best_val = r->m.val_loss, best_val_step = r->m.step;
    }
  std::vector<double> mfu_sorted;
  for (double m : mfu)
    if (std::isfinite(m)) mfu_sorted.push_back(m);
  std::sort(mfu_sorted.begin(), mfu_sorted.end());
  rows.push_back({"steps", str_cat(rs.front()->m.step, " .. ", last.m.step, " (", rs.size(), " records)")});
  rows.push_back({"wall time", fmt_seconds(last.wall)});
  rows.push_back({"final training loss", fmt(last.m.loss)});
  rows.push_back({"final validation loss", std::isfinite(final_val) ? str_cat(fmt(final_val), " (best ", fmt(best_val),
                                                                              " at step ", best_val_step, ")")
                                                                    : "none logged"});
  rows.push_back({"tokens/s (all steps)", time > 0 ? fmt(tokens / time, "%.0f") : "n/a"});
  rows.push_back({"MFU (median step)", fmt(100 * percentile(mfu_sorted, 0.5), "%.1f%%")});
  rows.push_back({"skipped steps (non-finite loss)", std::to_string(skipped)});
  if (run.budget_steps > 0)
    rows.push_back({"time budget", str_cat(fmt_seconds(run.budget_s), ": ", run.budget_steps, " steps, chosen after step ",
                                           run.budget_at, " from a median warm-up step of ",
                                           fmt(run.budget_step_time, "%.3g"), " s; the steps shown took ",
                                           fmt_seconds(time))});
  if (!rs.front()->m.stages.empty()) rows.push_back({"pipeline stages", std::to_string(rs.front()->m.stages.size())});
  pg.table({"", ""}, rows);
  std::vector<std::string> notes;
  if (run.replaced > 0)
    notes.push_back(str_cat(run.replaced, " step(s) were logged twice (the run was resumed from a checkpoint): the later record is shown"));
  if (run.dropped_torn_line)
    notes.push_back("the last line of the file is incomplete (the run was stopped while writing it) and is left out");
  if (run.other_events > 0) notes.push_back(str_cat(run.other_events, " event record(s) of unknown kind are not shown"));
  if (!std::isfinite(rs.front()->m.elapsed_s))
    notes.push_back("no elapsed_s in these metrics: wall time is the sum of the step times (evaluation time not included)");
  std::error_code ec;
  if (fs::exists(run_dir + "/metrics.jsonl.prev", ec))
    notes.push_back("an earlier run's metrics are kept beside these as metrics.jsonl.prev (not shown)");
  for (const auto& n : notes) pg.p(svg::escape("Note: " + n + "."));

  const std::string cfg_path = run_dir + "/config.json";
  if (io::entry_exists(cfg_path)) {  // a symlinked config.json is refused by load_config, not skipped
    const model::ModelConfig c = model::load_config(cfg_path, /*in_folder=*/true);
    const model::ParamCounts pc = model::count_params(c);
    pg.p(svg::escape(str_cat("Model (", cfg_path, "): ", c.num_hidden_layers, " layers (", c.num_moe_layers(),
                             " MoE), hidden ", c.hidden_size, ", ", c.num_attention_heads, " heads, ", c.n_routed_experts,
                             " routed experts of width ", c.moe_intermediate_size, ", top-", c.num_experts_per_tok, ", ",
                             c.n_shared_experts, " shared, vocab ", c.vocab_size, "; ", fmt(pc.total / 1e6, "%.2f"),
                             "M parameters (", fmt(pc.active / 1e6, "%.2f"), "M active per token).")));
  } else {
    pg.p(svg::escape(str_cat("No config.json in ", run_dir, " (it is written when a run finishes).")));
  }
}

void section_losses(Page& pg, const std::vector<const Rec*>& rs) {
  std::vector<double> step, wall, loss, ce, val;
  for (const Rec* r : rs) {
    step.push_back(r->m.step);
    wall.push_back(r->wall);
    loss.push_back(r->m.loss);
    ce.push_back(r->m.ce_loss);
    val.push_back(r->m.val_loss);
  }
  pg.h2("loss", "Loss");
  if (!any_finite(loss) && !any_finite(val)) return pg.none("No finite loss in these metrics (every step was skipped).");
  auto series = [&](const std::vector<double>& x) {
    std::vector<svg::Series> s = {{"training loss", x, loss}, {"cross-entropy", x, ce}};
    if (any_finite(val)) s.push_back({"validation loss", x, val, /*markers=*/true, /*line=*/true});
    return s;
  };
  pg.plot(svg::line_chart({"Loss against step (nats per token)", "step", "loss"}, series(step)));
  pg.plot(svg::line_chart({"Loss against wall time", "wall time (s)", "loss"}, series(wall)));
}

void section_throughput(Page& pg, const std::vector<const Rec*>& rs) {
  std::vector<double> step, tps, mfu;
  for (const Rec* r : rs) {
    step.push_back(r->m.step);
    tps.push_back(r->m.tokens_per_s);
    mfu.push_back(100 * r->m.mfu);
  }
  pg.h2("throughput", "Throughput");
  if (any_finite(tps))
    pg.plot(smoothed_chart({"Tokens per second (global batch)", "step", "tokens/s"}, "per step", step, tps));
  else
    pg.none("No tokens_per_s in these metrics.");
  if (any_finite(mfu))
    pg.plot(smoothed_chart({"MFU (model FLOPs / the sgemm rate measured at start, per rank)", "step", "MFU (%)"},
                           "per step", step, mfu));
  else
    pg.none("No mfu in these metrics.");
}

void section_step_time(Page& pg, const std::vector<const Rec*>& rs) {
  pg.h2("step-time", "Step time");
  std::vector<double> step, t, sorted;
  for (const Rec* r : rs) {
    step.push_back(r->m.step);
    t.push_back(r->m.step_time_s);
    if (std::isfinite(r->m.step_time_s)) sorted.push_back(r->m.step_time_s);
  }
  if (sorted.empty()) return pg.none("No step_time_s in these metrics.");
  std::sort(sorted.begin(), sorted.end());
  const double p50 = percentile(sorted, 0.5), p95 = percentile(sorted, 0.95);
  const double q1 = percentile(sorted, 0.25), q3 = percentile(sorted, 0.75);
  // Tukey's far-out fence: a step slower than Q3 + 3 IQR is an outlier.
  const double fence = q3 + 3 * (q3 - q1);
  std::vector<std::pair<double, int>> out;
  for (const Rec* r : rs)
    if (r->m.step_time_s > fence) out.push_back({r->m.step_time_s, r->m.step});
  std::sort(out.rbegin(), out.rend());
  svg::Axes h{"Step-time distribution", "step time (s)", "steps"};
  pg.plot(svg::histogram(h, t, 40, {{"p50 " + fmt_seconds(p50), p50}, {"p95 " + fmt_seconds(p95), p95}}));
  std::vector<double> ox, oy;
  for (const auto& [v, s] : out) ox.push_back(s), oy.push_back(v);
  std::vector<svg::Series> ss = {{"step time", step, t}};
  if (!out.empty()) ss.push_back({"outliers", ox, oy, /*markers=*/true, /*line=*/false});
  svg::Axes a{"Step time against step", "step", "seconds"};
  a.y_from_zero = true;
  pg.plot(svg::line_chart(a, ss));
  std::string line = str_cat("p50 ", fmt_seconds(p50), ", p95 ", fmt_seconds(p95), ", max ", fmt_seconds(sorted.back()),
                             ". Outliers (slower than Q3 + 3 IQR = ", fmt_seconds(fence), "): ");
  if (out.empty()) {
    line += "none.";
  } else {
    line += str_cat(out.size(), " step(s)");
    for (size_t i = 0; i < out.size() && i < 12; ++i)
      line += str_cat(i == 0 ? ": " : ", ", "step ", out[i].second, " (", fmt_seconds(out[i].first), ")");
    line += out.size() > 12 ? ", ..." : ".";
  }
  pg.p(svg::escape(line));
  // Where the time goes (means over the run).
  std::vector<double> c, s, o, a2a, b;
  for (const Rec* r : rs) c.push_back(r->m.time_s.compute), s.push_back(r->m.time_s.grad_sync), o.push_back(r->m.time_s.optimizer),
                          a2a.push_back(r->m.time_s.all_to_all), b.push_back(r->m.time_s.bubble);
  if (any_finite(c))
    pg.p(svg::escape(str_cat("Mean per step on rank 0: compute ", fmt_seconds(mean(c)), ", pipeline wait ",
                             fmt_seconds(mean(b)), ", gradient sync ", fmt_seconds(mean(s)), ", optimizer ",
                             fmt_seconds(mean(o)), "; all-to-all of the slowest stage ", fmt_seconds(mean(a2a)), ".")));
}

// Each rank's own exchange time (a2a_rank_s): a rank behind a slow link waits longest, and so do
// the ranks of its node. Steps whose rank count differs from the last step's are left out.
void section_a2a_ranks(Page& pg, const std::vector<const Rec*>& rs) {
  size_t n = 0;
  int rpn = 0;
  for (const Rec* r : rs)
    if (!r->m.a2a_rank_s.empty()) n = r->m.a2a_rank_s.size(), rpn = r->m.ranks_per_node;
  if (n < 2) return;
  std::vector<std::vector<double>> per(n);
  for (const Rec* r : rs)
    if (r->m.a2a_rank_s.size() == n)
      for (size_t q = 0; q < n; ++q) per[q].push_back(r->m.a2a_rank_s[q]);
  std::vector<double> means(n);
  for (size_t q = 0; q < n; ++q) means[q] = mean(per[q]);
  std::vector<double> sorted = means;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[n / 2];
  std::vector<std::vector<std::string>> rows;
  for (size_t q = 0; q < n; ++q) {
    const double mx = *std::max_element(per[q].begin(), per[q].end());
    rows.push_back({std::to_string(q), rpn > 0 ? std::to_string(q / rpn) : "n/a", fmt_seconds(means[q]),
                    fmt_seconds(mx), median > 0 ? fmt(means[q] / median, "%.2fx") : "n/a"});
  }
  pg.p("Each rank's own time inside the token exchange, per step (a rank behind a slow link, and the ranks "
       "that wait for it, stand out):");
  pg.table({"rank", "node", "mean per step", "max", "of the median rank"}, rows);
  const size_t slow = static_cast<size_t>(std::max_element(means.begin(), means.end()) - means.begin());
  pg.p(svg::escape(str_cat("Slowest: rank ", slow, rpn > 0 ? str_cat(" (node ", slow / rpn, ")") : std::string(),
                           ", ", fmt(median > 0 ? means[slow] / median : NAN, "%.2fx"), " the median rank's exchange time.")));
}

void section_a2a(Page& pg, const std::vector<const Rec*>& rs) {
  pg.h2("all-to-all", "All-to-all");
  std::vector<double> step, share;
  std::array<std::vector<double>, 4> bytes;
  std::array<double, 4> total{0, 0, 0, 0};
  bool any = false;
  for (const Rec* r : rs) {
    step.push_back(r->m.step);
    share.push_back(r->m.step_time_s > 0 ? 100 * r->m.time_s.all_to_all / r->m.step_time_s : NAN);
    for (int c = 0; c < 4; ++c) {
      bytes[c].push_back(r->m.a2a_bytes[c]);
      if (std::isfinite(r->m.a2a_bytes[c])) total[c] += r->m.a2a_bytes[c];
      any = any || r->m.a2a_bytes[c] > 0;
    }
    any = any || r->m.time_s.all_to_all > 0;
  }
  if (!any)
    return pg.none("No all-to-all in this run: no bytes and no time logged for the token exchange (expert parallelism "
                   "off, every expert on every rank).");
  pg.plot(smoothed_chart({"All-to-all share of the step", "step", "% of step time"}, "all-to-all", step, share));
  std::vector<svg::Series> ss;
  for (int c = 0; c < 4; ++c)
    if (total[c] > 0) ss.push_back({kLinkClasses[c], step, bytes[c]});
  if (!ss.empty()) {
    svg::Axes b{"All-to-all bytes per step by link class (all ranks)", "step", "bytes"};
    b.y_from_zero = true;
    pg.plot(svg::line_chart(b, ss));
  }
  std::vector<std::vector<std::string>> rows;
  const double n = static_cast<double>(rs.size());
  double sum = 0;
  for (int c = 0; c < 4; ++c) sum += total[c];
  for (int c = 0; c < 4; ++c)
    rows.push_back({kLinkClasses[c], fmt_bytes(total[c] / n), fmt_bytes(total[c]), sum > 0 ? fmt(100 * total[c] / sum, "%.1f%%") : "n/a"});
  pg.table({"link class", "mean per step", "whole run", "share"}, rows);
  pg.p(svg::escape(str_cat("Mean all-to-all share of the step: ", fmt(mean(share), "%.1f%%"), ".")));
  section_a2a_ranks(pg, rs);
}

void section_expert_load(Page& pg, const Run& run, const std::vector<const Rec*>& rs, const std::string& run_dir) {
  pg.h2("expert-load", "Expert load");
  std::vector<const Rec*> with;
  for (const Rec* r : rs)
    if (!r->loads.empty()) with.push_back(r);
  if (with.empty()) return pg.none("No expert_loads in these metrics (a dense model, or older metrics).");
  const int L = run.loads_layers, E = run.loads_experts;
  std::vector<int> ids = run.loads_layer_ids;
  if (ids.empty()) {  // older metrics: the MoE layers of config.json, when it is there
    std::error_code ec;
    if (io::entry_exists(run_dir + "/config.json")) {
      const model::ModelConfig c = model::load_config(run_dir + "/config.json", /*in_folder=*/true);
      for (int l = 0; l < c.num_hidden_layers; ++l)
        if (c.is_moe_layer(l)) ids.push_back(l);
    }
    if (static_cast<int>(ids.size()) != L) ids.clear();
  }
  auto layer_name = [&](int i) { return ids.empty() ? str_cat("MoE layer ", i) : str_cat("layer ", ids[static_cast<size_t>(i)]); };
  // Imbalance over time: max / mean load of each layer.
  std::vector<svg::Series> imb;
  for (int l = 0; l < L; ++l) {
    svg::Series s{layer_name(l), {}, {}};
    for (const Rec* r : with) {
      const float* v = r->loads.data() + static_cast<size_t>(l) * E;
      const double mx = *std::max_element(v, v + E), mn = std::accumulate(v, v + E, 0.0) / E;
      s.x.push_back(r->m.step);
      s.y.push_back(mn > 0 ? mx / mn : NAN);
    }
    imb.push_back(std::move(s));
  }
  svg::Axes ai{"Load imbalance: busiest expert / mean, per MoE layer", "step", "max / mean"};
  ai.y_from_zero = true;
  pg.plot(svg::line_chart(ai, imb));
  // Heatmap: rows (layer, expert), columns time buckets, value = share of the layer's mean.
  const int shown_layers = std::max(1, std::min(L, static_cast<int>(kMaxHeatmapCells / 10 / static_cast<size_t>(E))));
  const int rows = shown_layers * E;
  const int C = std::max(1, std::min({kMaxHeatmapColumns, static_cast<int>(with.size()),
                                      static_cast<int>(kMaxHeatmapCells / static_cast<size_t>(rows))}));
  svg::Heatmap h;
  h.value_RC.assign(static_cast<size_t>(rows), std::vector<double>(static_cast<size_t>(C), NAN));
  for (int c = 0; c < C; ++c) {
    const size_t b = with.size() * c / C, e = with.size() * (c + 1) / C;
    for (int l = 0; l < shown_layers; ++l) {
      std::vector<double> sum(static_cast<size_t>(E), 0.0);
      for (size_t i = b; i < e; ++i)
        for (int x = 0; x < E; ++x) sum[static_cast<size_t>(x)] += with[i]->loads[static_cast<size_t>(l) * E + x];
      const double m = std::accumulate(sum.begin(), sum.end(), 0.0) / E;
      for (int x = 0; x < E; ++x)
        h.value_RC[static_cast<size_t>(l * E + x)][static_cast<size_t>(c)] = m > 0 ? sum[static_cast<size_t>(x)] / m : NAN;
    }
  }
  for (int l = 0; l < shown_layers; ++l) {
    h.group_starts.push_back(l * E);
    for (int x = 0; x < E; ++x)
      h.row_labels.push_back(ids.empty() ? str_cat("M", l, " e", x) : str_cat("L", ids[static_cast<size_t>(l)], " e", x));
  }
  h.x0 = with.front()->m.step;
  h.x1 = with.back()->m.step;
  h.legend_high = ">= 2x mean";
  h.legend_low = "<= 0.5x mean";
  pg.plot(svg::heatmap({"Tokens per expert over time, relative to the layer's mean (rows: layer, expert)", "step", ""}, h));
  std::string note = str_cat(L, " MoE layer(s) x ", E, " experts, ", C, " time bucket(s) of ~",
                             std::max<size_t>(1, with.size() / static_cast<size_t>(C)), " logged step(s)");
  if (run.loads_stride > 1) note += str_cat("; loads of every ", run.loads_stride, "th step kept (a large file)");
  if (shown_layers < L) note += str_cat("; the first ", shown_layers, " layers are drawn");
  pg.p(svg::escape(note + "."));
}

void section_pipeline(Page& pg, const std::vector<const Rec*>& rs) {
  pg.h2("pipeline", "Pipeline bubble per stage");
  size_t P = 0;
  for (const Rec* r : rs) P = std::max(P, r->m.stages.size());
  if (P == 0) return pg.none("No per-stage figures (\"stages\") in these metrics.");
  if (P == 1) return pg.none("One pipeline stage (no pipeline parallelism): no bubble.");
  std::vector<svg::Series> ss;
  std::vector<svg::Bar> bars;
  std::vector<std::vector<std::string>> rows;
  for (size_t s = 0; s < P; ++s) {
    svg::Series x{str_cat("stage ", s), {}, {}};
    std::vector<double> comp, bub, a2a, frac, act, tot, fl, layers;
    for (const Rec* r : rs) {
      if (s >= r->m.stages.size()) continue;
      const train::StageRecord& st = r->m.stages[s];
      x.x.push_back(r->m.step);
      const double f = st.step_s > 0 ? 100 * st.bubble_s / st.step_s : NAN;
      x.y.push_back(f);
      frac.push_back(f);
      comp.push_back(st.compute_s - (std::isfinite(st.all_to_all_s) ? st.all_to_all_s : 0.0));
      a2a.push_back(st.all_to_all_s);
      bub.push_back(st.bubble_s);
      act.push_back(st.activation_peak_bytes);
      tot.push_back(st.total_peak_bytes);
      fl.push_back(st.max_in_flight);
      layers.push_back(st.layers);
    }
    ss.push_back(std::move(x));
    bars.push_back({str_cat("stage ", s), {mean(comp), mean(a2a), mean(bub)}});
    auto mx = [](const std::vector<double>& v) {
      double m = NAN;
      for (double d : v)
        if (std::isfinite(d) && !(d <= m)) m = d;
      return m;
    };
    rows.push_back({std::to_string(s), fmt(mean(layers), "%.0f"), fmt_seconds(mean(comp)), fmt_seconds(mean(a2a)),
                    fmt_seconds(mean(bub)), fmt(mean(frac), "%.1f%%"), fmt_bytes(mx(act)), fmt_bytes(mx(tot)),
                    fmt(mx(fl), "%.0f")});
  }
  svg::Axes a{"Bubble per stage (pipeline wait / stage step time)", "step", "bubble (%)"};
  a.y_from_zero = true;
  pg.plot(svg::line_chart(a, ss));
  svg::Axes b{"Mean seconds per step and stage", "", "seconds"};
  pg.plot(svg::stacked_bars(b, {"compute", "all-to-all", "bubble (waiting)"}, bars));
  pg.table({"stage", "layers", "compute", "all-to-all", "bubble", "bubble %", "activation peak", "total peak",
            "micro-batches held"},
           rows);
}

// Expert parallelism: each MoE layer's tokens per EP rank (rank_loads) and their max/mean
// (load_imbalance) over the run, the migrations marked where they happened. Left out when no record
// has them (--ep 1, or older metrics).
void section_balance(Page& pg, const Run& run, const std::vector<const Rec*>& rs) {
  std::vector<const Rec*> with;
  for (const Rec* r : rs)
    if (!r->m.load_imbalance.empty()) with.push_back(r);
  if (with.empty()) return;
  pg.h2("balance", "Expert balance across EP ranks");
  const size_t L = with.back()->m.load_imbalance.size(), R = with.back()->m.rank_loads.empty() ? 0 : with.back()->m.rank_loads[0].size();
  const std::vector<int>& ids = run.loads_layer_ids;
  auto name = [&](size_t i) { return ids.size() == L ? str_cat("layer ", ids[i]) : str_cat("MoE layer ", i); };
  std::vector<svg::Series> ss;
  std::vector<std::vector<std::string>> rows;
  svg::Series marks{"migrations", {}, {}, /*markers=*/true, /*line=*/false};
  for (size_t i = 0; i < L; ++i) {
    svg::Series x{name(i), {}, {}};
    std::vector<double> v, sum(R, 0.0);
    int n_loads = 0, moves = 0, swaps = 0;
    for (const Rec* r : with) {
      if (r->m.load_imbalance.size() != L) continue;
      x.x.push_back(r->m.step);
      x.y.push_back(r->m.load_imbalance[i]);
      v.push_back(r->m.load_imbalance[i]);
      if (r->m.rank_loads.size() == L && r->m.rank_loads[i].size() == R) {
        for (size_t q = 0; q < R; ++q) sum[q] += r->m.rank_loads[i][q];
        ++n_loads;
      }
      if (r->m.migration)
        for (const auto& l : r->m.migration->layers)
          if (ids.size() == L && l.layer == ids[i]) {
            ++moves, swaps += l.swaps;
            marks.x.push_back(r->m.step);
            marks.y.push_back(l.imbalance_before);
          }
    }
    std::string per_rank;
    for (size_t q = 0; q < R && n_loads > 0; ++q) per_rank += str_cat(q ? " / " : "", fmt(sum[q] / n_loads, "%.0f"));
    rows.push_back({name(i), fmt(v.front(), "%.3f"), fmt(v.back(), "%.3f"), fmt(mean(v), "%.3f"),
                    fmt(*std::max_element(v.begin(), v.end()), "%.3f"), per_rank.empty() ? "n/a" : per_rank,
                    str_cat(moves, " (", swaps, " swap(s))")});
    ss.push_back(std::move(x));
  }
  if (!marks.x.empty()) ss.push_back(std::move(marks));
  svg::Axes a{"EP-rank load imbalance per MoE layer (busiest rank / mean; 1 = balanced)", "step", "max / mean"};
  a.y_from_zero = true;
  pg.plot(svg::line_chart(a, ss));
  pg.p(svg::escape(str_cat(with.size(), " step(s) with EP-rank loads, ", R,
                           " EP rank(s); tokens per rank under each step's placement (the global batch's, summed over "
                           "the data-parallel groups).")));
  pg.table({"MoE layer", "imbalance, first step", "last step", "mean", "max", "mean tokens per EP rank", "migrations"},
           rows);
}

void section_migrations(Page& pg, const Run& run) {
  // One row per layer that migrated, by step (a step's layers ascending, as the trainer logs them);
  // the move's bytes and time on the step's first row.
  std::vector<std::vector<std::string>> rows;
  size_t n = 0;
  double bytes = 0;
  for (const auto& [step, r] : run.recs) {
    if (!r.m.migration) continue;
    const train::MigrationRecord& mg = *r.m.migration;
    if (std::isfinite(mg.bytes_moved)) bytes += mg.bytes_moved;
    for (size_t i = 0; i < mg.layers.size(); ++i, ++n) {
      if (rows.size() >= 200) continue;
      const auto& l = mg.layers[i];
      rows.push_back({std::to_string(step + 1), std::to_string(l.layer), str_cat(l.swaps, " swap(s)"),
                      str_cat(fmt(l.imbalance_before, "%.3f"), " -> ", fmt(l.imbalance_after, "%.3f")),
                      i == 0 ? fmt_bytes(mg.bytes_moved) : "", i == 0 ? fmt_seconds(mg.seconds) : ""});
    }
  }
  if (n == 0) return;  // rendered only when the metrics hold migrations
  pg.h2("migrations", "Expert migrations");
  pg.p(svg::escape(str_cat(n, " migration(s), ", fmt_bytes(bytes), " moved", n > 200 ? "; the first 200 are listed" : "",
                           ".")));
  pg.table({"before step", "layer", "moved", "rank imbalance (max/mean)", "bytes", "time"}, rows);
}

}  // namespace

std::string render_report(const std::string& run_dir, const std::string& metrics_path, bool metrics_in_folder) {
  const Run run = read_metrics(metrics_path, metrics_in_folder);
  std::vector<const Rec*> rs;
  for (const auto& [s, r] : run.recs) rs.push_back(&r);
  Page pg;
  section_summary(pg, run, rs, run_dir);
  section_losses(pg, rs);
  section_throughput(pg, rs);
  section_step_time(pg, rs);
  section_a2a(pg, rs);
  section_expert_load(pg, run, rs, run_dir);
  section_pipeline(pg, rs);
  section_balance(pg, run, rs);
  section_migrations(pg, run);
  const std::string title = str_cat("moetrain report: ", run_dir);
  return str_cat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>", svg::escape(title),
      "</title>\n<style>\nbody{font-family:sans-serif;margin:16px 24px;color:#222;max-width:1000px}\n"
      "h1{font-size:20px}h2{font-size:16px;border-bottom:1px solid #ccc;margin-top:28px}\n"
      "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px;text-align:left}\n"
      "p{font-size:13px}p.none{color:#777;font-style:italic}.fig{margin:6px 0}\n</style></head>\n<body>\n<h1>",
      svg::escape(title), "</h1>\n<p>", svg::escape(str_cat(metrics_path, ", ", run.lines, " line(s)")), "</p>\n",
      pg.body, "</body></html>\n");
}

ReportWritten write_report(const std::string& run, const std::string& output) {
  std::error_code ec;
  MOE_CHECK(fs::exists(run, ec), run, ": no such folder or file");
  const bool dir = fs::is_directory(run, ec);
  const std::string parent = fs::path(run).parent_path().string();
  // The run folder: RUN itself, or the folder of the metrics file RUN names.
  const std::string rd = dir ? run : (parent.empty() ? "." : parent);
  const std::string metrics = dir ? run + "/metrics.jsonl" : run;
  if (dir)
    MOE_CHECK(fs::exists(metrics, ec), run, ": no metrics.jsonl in this folder (not the --out folder of moetrain train?)");
  const std::string out = output.empty() ? rd + "/report.html" : output;
  const std::string flag = output.empty() ? "report" : "-o";
  // The page: a new or regular file, none of the files it is made from (io/output_file.h),
  // written beside its place under a fresh temporary name and renamed (no half-written page).
  io::check_output_path(out, flag, {metrics, rd + "/config.json", rd + "/metrics.jsonl", rd + "/metrics.jsonl.prev"});
  const std::string html = render_report(rd, metrics, dir);
  io::write_file_atomic(out, html, flag);
  return {out, metrics, html.size()};
}

}  // namespace moe::report
