// Reading a run's metrics.jsonl for the report. See metrics_run.h.
#include "report/metrics_run.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <istream>
#include <nlohmann/json.hpp>
#include <streambuf>

#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"

namespace moe::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A line of 61 layers x 256 experts of loads is ~100 KB; a file without newlines is an error.
constexpr size_t kMaxLineBytes = size_t{64} << 20;
// Expert loads kept in memory: beyond this many numbers, only every 2nd, 4th, ... step's loads
// are kept (the heatmap averages them over time buckets anyway).
constexpr size_t kMaxLoadValues = size_t{1} << 24;

// Next line of f into line (without '\n'); false at the end. *complete: the line ended in '\n'.
bool read_line(std::istream& f, std::string& line, const std::string& path, int n, bool* complete) {
  line.clear();
  std::streambuf* sb = f.rdbuf();
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      *complete = false;
      return !line.empty();
    }
    if (c == '\n') {
      *complete = true;
      return true;
    }
    MOE_CHECK(line.size() < kMaxLineBytes, path, ": line ", n, " is longer than ", kMaxLineBytes,
              " bytes (not a metrics.jsonl?)");
    line.push_back(static_cast<char>(c));
  }
}

// The record's expert loads into r.loads (floats, [layer][expert]): every line's must have the
// shape of the first's; the layer ids are the first line's that names them.
void keep_loads(Run& run, Rec& r, const std::string& where) {
  std::vector<std::vector<int64_t>> loads = std::move(r.m.expert_loads);
  r.m.expert_loads.clear();
  if (loads.empty()) return;  // absent, or a dense model
  const int L = static_cast<int>(loads.size()), E = static_cast<int>(loads[0].size());
  MOE_CHECK(run.loads_layers == 0 || (run.loads_layers == L && run.loads_experts == E), where, ": \"expert_loads\" is ",
            L, " layers x ", E, " experts, earlier lines had ", run.loads_layers, " x ", run.loads_experts);
  run.loads_layers = L;
  run.loads_experts = E;
  if (run.loads_layer_ids.empty()) run.loads_layer_ids = r.m.expert_loads_layers;
  if (r.m.step % run.loads_stride != 0) return;
  r.loads.reserve(static_cast<size_t>(L) * E);
  for (const auto& layer : loads)
    for (int64_t x : layer) r.loads.push_back(static_cast<float>(x));
}

// Keeps the loads within kMaxLoadValues by keeping only every (2 * stride)-th step's.
void thin_loads(Run& run) {
  size_t held = 0;
  for (auto& [s, r] : run.recs) held += r.loads.size();
  while (held > kMaxLoadValues) {
    run.loads_stride *= 2;
    held = 0;
    for (auto& [s, r] : run.recs) {
      if (s % run.loads_stride != 0) std::vector<float>().swap(r.loads);
      held += r.loads.size();
    }
  }
}

// A read-only stream over a descriptor opened by io::open_data_file (std::ifstream would open the
// path again, following a link).
class FdBuf : public std::streambuf {
 public:
  explicit FdBuf(int fd) : fd_(fd) {}

 protected:
  int_type underflow() override {
    for (;;) {
      const ssize_t n = ::read(fd_, buf_, sizeof buf_);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return traits_type::eof();
      setg(buf_, buf_, buf_ + n);
      return traits_type::to_int_type(buf_[0]);
    }
  }

 private:
  int fd_;
  char buf_[1 << 16];
};

}  // namespace

Run read_metrics(const std::string& path, bool in_folder) {
  std::error_code ec;
  MOE_CHECK(!fs::is_directory(path, ec), path, ": is a folder, not a metrics file");
  const io::DataFile file =
      io::open_data_file(path, "metrics file", in_folder ? io::Origin::kInFolder : io::Origin::kNamed);
  FdBuf buf(file.fd());
  std::istream f(&buf);
  Run run;
  run.metrics_path = path;
  std::string line;
  bool complete = true;
  double wall_offset = 0, last_elapsed = -1, last_wall = 0;
  size_t loads_since_thin = 0;
  while (read_line(f, line, path, run.lines + 1, &complete)) {
    ++run.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str_cat(path, ": line ", run.lines);
    json j;
    try {
      j = io::parse_json(line, where);
    } catch (const Error&) {
      // Killed mid-write: the torn last line is left out, and the page says so.
      if (!complete) {
        run.dropped_torn_line = true;
        break;
      }
      throw;
    }
    MOE_CHECK(j.is_object(), where, ": not a JSON object (not a metrics.jsonl?)");
    if (j.contains("event")) {
      ++run.other_events;
      continue;
    }
    MOE_CHECK(j.contains("step"), where, ": not a step record (no \"step\")");
    Rec r;
    r.m = train::step_record_from_json(j, where);
    keep_loads(run, r, where);
    if (r.m.time_budget) {
      run.budget_s = r.m.time_budget->budget_s;
      run.budget_step_time = r.m.time_budget->step_time_s;
      run.budget_steps = r.m.time_budget->steps;
      run.budget_at = r.m.step;
    }
    // Wall time across processes: a resumed run's elapsed_s starts again from 0.
    if (std::isfinite(r.m.elapsed_s)) {
      if (r.m.elapsed_s < last_elapsed) wall_offset = last_wall;
      r.wall = wall_offset + r.m.elapsed_s;
      last_elapsed = r.m.elapsed_s;
    } else {
      r.wall = last_wall + (std::isfinite(r.m.step_time_s) ? r.m.step_time_s : 0.0);
      wall_offset = r.wall;
      last_elapsed = -1;
    }
    last_wall = r.wall;
    loads_since_thin += r.loads.size();
    if (run.recs.count(r.m.step)) ++run.replaced;
    const int step = r.m.step;
    run.recs[step] = std::move(r);
    if (loads_since_thin > kMaxLoadValues / 4) {
      thin_loads(run);
      loads_since_thin = 0;
    }
  }
  thin_loads(run);
  MOE_CHECK(!run.recs.empty(), path, ": no step records (", run.lines, " lines): not the metrics of a training run");
  return run;
}


}  // namespace moe::report
