#include "train/step_record.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/json_file.h"

namespace moe::train {
using nlohmann::json;

json to_json(const StepRecord& r) {
  json stages = json::array();
  for (const StageRecord& st : r.stages)
    stages.push_back({{"stage", st.stage},
                      {"layers", static_cast<int>(st.layers)},
                      {"compute_s", st.compute_s},
                      {"bubble_s", st.bubble_s},
                      {"all_to_all_s", st.all_to_all_s},
                      {"step_s", st.step_s},
                      {"activation_peak_bytes", st.activation_peak_bytes},
                      {"total_peak_bytes", st.total_peak_bytes},
                      {"max_in_flight", static_cast<int>(st.max_in_flight)}});
  json bytes;
  for (int c = 0; c < 4; ++c) bytes[kLinkClassNames[c]] = static_cast<int64_t>(r.a2a_bytes[c]);
  json j = {{"step", r.step},
            {"loss", r.loss},
            {"ce_loss", r.ce_loss},
            {"aux_loss", r.aux_loss},
            {"mtp_loss", r.mtp_loss},
            {"lr", r.lr},
            {"grad_norm", r.grad_norm},
            {"tokens", static_cast<long long>(r.tokens)},
            {"tokens_per_s", r.tokens_per_s},
            {"mfu", r.mfu},
            // clang-format off
            {"mfu_peak", {{"gflops", r.mfu_peak.gflops}, {"precision", r.mfu_peak.precision},
                          {"source", r.mfu_peak.source}}},
            // clang-format on
            {"step_time_s", r.step_time_s},
            {"elapsed_s", r.elapsed_s},
            {"bubble_fraction", r.bubble_fraction},
            // clang-format off
            {"time_s",
             {{"pipeline", r.time_s.pipeline}, {"compute", r.time_s.compute}, {"bubble", r.time_s.bubble},
              {"grad_sync", r.time_s.grad_sync}, {"optimizer", r.time_s.optimizer},
              {"all_to_all", r.time_s.all_to_all}}},
            // clang-format on
            {"a2a_rank_s", r.a2a_rank_s},
            {"ranks_per_node", r.ranks_per_node},
            {"a2a_bytes", bytes},
            {"activation_peak_bytes", static_cast<uint64_t>(r.activation_peak_bytes)},
            {"optimizer_bytes", r.optimizer_bytes},
            {"moe_dispatch_bytes", r.moe_dispatch_bytes},
            {"stages", stages},
            {"expert_loads", r.expert_loads.empty() ? json::array() : json(r.expert_loads)},
            {"expert_loads_layers", r.expert_loads_layers}};
  if (!r.time_s.moe.empty()) {
    json moe;
    for (const auto& [name, s] : r.time_s.moe) moe[name] = s;
    j["time_s"]["moe"] = moe;
  }
  if (!r.load_imbalance.empty()) {
    j["rank_loads"] = r.rank_loads;
    j["load_imbalance"] = r.load_imbalance;
  }
  if (r.migration) {
    json layers = json::array();
    for (const MigrationRecord::Layer& l : r.migration->layers)
      layers.push_back({{"layer", l.layer},
                        {"swaps", l.swaps},
                        {"imbalance_before", l.imbalance_before},
                        {"imbalance_after", l.imbalance_after}});
    j["migration"] = {{"layers", layers}, {"bytes_moved", r.migration->bytes_moved}, {"seconds", r.migration->seconds}};
  }
  if (r.time_budget) {
    const TimeBudgetRecord& b = *r.time_budget;
    j["time_budget"] = {{"budget_s", b.budget_s},
                        {"step_time_s", b.step_time_s},
                        {"timed_steps", b.timed_steps},
                        {"spent_s", b.spent_s},
                        {"steps", b.steps}};
  }
  if (!std::isnan(r.val_loss)) j["val_loss"] = r.val_loss;
  if (!std::isnan(r.val_loss_nats_per_byte)) j["val_loss_nats_per_byte"] = r.val_loss_nats_per_byte;
  if (!std::isnan(r.val_loss_start)) j["val_loss_start"] = r.val_loss_start;
  return j;
}

void append_step_record(std::ostream& out, const StepRecord& r, const std::string& path) {
  out << to_json(r).dump() << "\n";
  out.flush();
  if (!out.good())
    throw Error(str_cat(path, ": cannot write the record of step ", r.step, " (", std::strerror(errno), ")"));
}

namespace {

// A numeric field: absent or null -> NaN (null is how a non-finite number is written); any
// other non-number is an error naming the line and the field.
double number(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) return NAN;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return NAN;
  MOE_CHECK(it->is_number(), where, ": \"", key, "\" must be a number, got ", io::excerpt(*it));
  return it->get<double>();
}

// A required integer in [0, 2^31).
int integer(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  MOE_CHECK(it != j.end(), where, ": no \"", key, "\"");
  MOE_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() < (int64_t{1} << 31), where,
            ": \"", key, "\" must be an integer in [0, 2^31), got ", io::excerpt(*it));
  return static_cast<int>(it->get<int64_t>());
}

// An optional list of numbers in [lo, hi) of at most kMaxRecordRanks entries (absent: empty).
std::vector<double> numbers(const json& j, const char* key, double lo, double hi, const char* what,
                            const std::string& where) {
  std::vector<double> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  MOE_CHECK(it->is_array() && it->size() <= kMaxRecordRanks, where, ": \"", key, "\" must be a list of at most ",
            kMaxRecordRanks, " numbers");
  for (const json& v : *it) {
    MOE_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= lo && v.get<double>() < hi,
              where, ": \"", key, "\" holds ", io::excerpt(v), ", not ", what);
    out.push_back(v.get<double>());
  }
  return out;
}

// An optional object (absent or null: nullptr).
const json* object(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  MOE_CHECK(it->is_object(), where, ": \"", key, "\" must be an object");
  return &*it;
}

void read_loads(StepRecord& r, const json& j, const std::string& where) {
  if (auto it = j.find("expert_loads"); it != j.end() && !it->is_null()) {
    MOE_CHECK(it->is_array(), where, ": \"expert_loads\" must be a list of lists");
    size_t E = 0;
    for (const json& layer : *it) {
      MOE_CHECK(layer.is_array() && !layer.empty(), where, ": \"expert_loads\" must be a list of lists");
      MOE_CHECK(E == 0 || layer.size() == E, where, ": \"expert_loads\" has layers of ", E, " and ", layer.size(),
                " experts");
      E = layer.size();
      std::vector<int64_t> row;
      row.reserve(E);
      for (const json& x : layer) {
        MOE_CHECK(x.is_number() && x.get<double>() >= 0 && x.get<double>() < 9e18, where, ": expert load ",
                  io::excerpt(x), " is not a count");
        row.push_back(static_cast<int64_t>(x.get<double>()));
      }
      r.expert_loads.push_back(std::move(row));
    }
  }
  if (auto ids = j.find("expert_loads_layers"); ids != j.end() && !ids->is_null() && !r.expert_loads.empty()) {
    MOE_CHECK(ids->is_array() && ids->size() == r.expert_loads.size(), where,
              ": \"expert_loads_layers\" must list one layer per row of \"expert_loads\"");
    for (const json& id : *ids) {
      MOE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < 1000000, where,
                ": \"expert_loads_layers\" holds ", io::excerpt(id), ", not a layer index");
      r.expert_loads_layers.push_back(static_cast<int>(id.get<int64_t>()));
    }
  }
  r.load_imbalance = numbers(j, "load_imbalance", 0, 1e300, "a max/mean load ratio", where);
  if (auto it = j.find("rank_loads"); it != j.end() && !it->is_null()) {
    MOE_CHECK(it->is_array() && it->size() == r.load_imbalance.size(), where,
              ": \"rank_loads\" must be a list with one list per entry of \"load_imbalance\"");
    for (const json& layer : *it) {
      MOE_CHECK(layer.is_array() && !layer.empty() && layer.size() <= kMaxRecordRanks, where,
                ": \"rank_loads\" must be a list of lists of tokens per EP rank");
      std::vector<double> row;
      for (const json& x : layer) {
        MOE_CHECK(x.is_number() && std::isfinite(x.get<double>()) && x.get<double>() >= 0, where,
                  ": \"rank_loads\" holds ", io::excerpt(x), ", not a token count");
        row.push_back(x.get<double>());
      }
      r.rank_loads.push_back(std::move(row));
    }
  }
}

}  // namespace

StepRecord step_record_from_json(const json& j, const std::string& where) {
  MOE_CHECK(j.is_object(), where, ": not a JSON object (not a metrics.jsonl?)");
  StepRecord r;
  r.step = integer(j, "step", where);
  r.loss = number(j, "loss", where);
  r.ce_loss = number(j, "ce_loss", where);
  r.aux_loss = number(j, "aux_loss", where);
  r.mtp_loss = number(j, "mtp_loss", where);
  r.lr = number(j, "lr", where);
  r.grad_norm = number(j, "grad_norm", where);
  r.tokens = number(j, "tokens", where);
  r.tokens_per_s = number(j, "tokens_per_s", where);
  r.mfu = number(j, "mfu", where);
  if (const json* p = object(j, "mfu_peak", where)) {
    r.mfu_peak.gflops = number(*p, "gflops", where);
    if (auto s = p->find("precision"); s != p->end() && s->is_string()) r.mfu_peak.precision = s->get<std::string>();
    if (auto s = p->find("source"); s != p->end() && s->is_string()) r.mfu_peak.source = s->get<std::string>();
  }
  r.step_time_s = number(j, "step_time_s", where);
  r.elapsed_s = number(j, "elapsed_s", where);
  r.bubble_fraction = number(j, "bubble_fraction", where);
  if (const json* t = object(j, "time_s", where)) {
    r.time_s.pipeline = number(*t, "pipeline", where);
    r.time_s.compute = number(*t, "compute", where);
    r.time_s.bubble = number(*t, "bubble", where);
    r.time_s.grad_sync = number(*t, "grad_sync", where);
    r.time_s.optimizer = number(*t, "optimizer", where);
    r.time_s.all_to_all = number(*t, "all_to_all", where);
    if (const json* moe = object(*t, "moe", where))
      for (const auto& [name, v] : moe->items()) r.time_s.moe.emplace_back(name, number(*moe, name.c_str(), where));
  }
  r.a2a_rank_s = numbers(j, "a2a_rank_s", 0, 1e7, "a number of seconds in [0, 1e7)", where);
  if (j.contains("ranks_per_node")) {
    r.ranks_per_node = integer(j, "ranks_per_node", where);
    MOE_CHECK(r.ranks_per_node >= 1, where, ": \"ranks_per_node\" must be >= 1");
  }
  if (const json* b = object(j, "a2a_bytes", where))
    for (int c = 0; c < 4; ++c) r.a2a_bytes[c] = number(*b, kLinkClassNames[c], where);
  r.activation_peak_bytes = number(j, "activation_peak_bytes", where);
  r.optimizer_bytes = numbers(j, "optimizer_bytes", 0, 1e300, "a number of bytes", where);
  r.moe_dispatch_bytes = numbers(j, "moe_dispatch_bytes", 0, 1e300, "a number of bytes", where);
  if (auto st = j.find("stages"); st != j.end() && !st->is_null()) {
    MOE_CHECK(st->is_array(), where, ": \"stages\" must be a list");
    for (const json& s : *st) {
      MOE_CHECK(s.is_object(), where, ": \"stages\" must be a list of objects");
      StageRecord x;
      x.stage = static_cast<int>(r.stages.size());
      x.layers = number(s, "layers", where);
      x.compute_s = number(s, "compute_s", where);
      x.bubble_s = number(s, "bubble_s", where);
      x.all_to_all_s = number(s, "all_to_all_s", where);
      x.step_s = number(s, "step_s", where);
      x.activation_peak_bytes = number(s, "activation_peak_bytes", where);
      x.total_peak_bytes = number(s, "total_peak_bytes", where);
      x.max_in_flight = number(s, "max_in_flight", where);
      r.stages.push_back(x);
    }
  }
  read_loads(r, j, where);
  if (auto mg = j.find("migration"); mg != j.end() && !mg->is_null()) {
    MOE_CHECK(mg->is_object() && mg->contains("layers") && (*mg)["layers"].is_array(), where,
              ": \"migration\" must be an object with a \"layers\" list");
    MigrationRecord m;
    for (const json& l : (*mg)["layers"]) {
      MOE_CHECK(l.is_object(), where, ": \"migration\".\"layers\" must be a list of objects");
      m.layers.push_back({integer(l, "layer", where), integer(l, "swaps", where), number(l, "imbalance_before", where),
                          number(l, "imbalance_after", where)});
    }
    m.bytes_moved = number(*mg, "bytes_moved", where);
    m.seconds = number(*mg, "seconds", where);
    r.migration = std::move(m);
  }
  if (const json* tb = object(j, "time_budget", where)) {
    TimeBudgetRecord b;
    b.budget_s = number(*tb, "budget_s", where);
    b.step_time_s = number(*tb, "step_time_s", where);
    MOE_CHECK(b.budget_s > 0 && b.budget_s <= 1e7 && b.step_time_s > 0 && b.step_time_s <= 1e7, where,
              ": \"time_budget\" needs budget_s and step_time_s in (0, 1e7] seconds");
    b.spent_s = number(*tb, "spent_s", where);
    b.steps = integer(*tb, "steps", where);
    if (tb->contains("timed_steps")) b.timed_steps = integer(*tb, "timed_steps", where);
    r.time_budget = b;
  }
  r.val_loss = number(j, "val_loss", where);
  r.val_loss_nats_per_byte = number(j, "val_loss_nats_per_byte", where);
  r.val_loss_start = number(j, "val_loss_start", where);
  return r;
}

const std::vector<FieldDoc>& step_record_fields() {
  static const std::vector<FieldDoc> fields = {
      {"step", "integer", "every step", "the optimizer step, 1-based"},
      {"loss", "number or null", "every step",
       "training loss of the global batch, ce_loss + aux_loss + the MTP weight x mtp_loss; null when not "
       "finite (the step was skipped)"},
      {"ce_loss", "number or null", "every step", "cross-entropy, nats per token"},
      {"aux_loss", "number or null", "every step", "the routers' auxiliary balance loss, summed over MoE layers"},
      {"mtp_loss", "number or null", "every step",
       "DeepSeek-V3's multi-token prediction: the MTP module's cross-entropy of token t+2 (0 without the module)"},
      {"lr", "number", "every step", "learning rate of this step"},
      {"grad_norm", "number or null", "every step",
       "global gradient norm before clipping; null on a skipped step"},
      {"tokens", "integer", "every step", "tokens of the global batch (batch x data ranks x seq-len)"},
      {"tokens_per_s", "number", "every step", "tokens / step_time_s"},
      {"mfu", "number", "every step", "model FLOPs per second / (mfu_peak.gflops x ranks), a fraction"},
      {"mfu_peak", "object", "every step", "MFU's denominator"},
      {"mfu_peak.gflops", "number", "every step", "GFLOP/s per rank"},
      {"mfu_peak.precision", "string", "every step", "the GEMM precision it was measured in: fp32 or bf16"},
      {"mfu_peak.source", "string", "every step", "\"measured\" (at start) or \"--peak-gflops\""},
      {"step_time_s", "number", "every step",
       "seconds of the step on this rank (data, forward, backward, sync, update)"},
      {"elapsed_s", "number", "every step",
       "wall seconds since this process began training (a resumed run starts again from 0)"},
      {"bubble_fraction", "number", "every step", "the worst stage's pipeline wait / its step time"},
      {"time_s", "object", "every step", "where rank 0's step went, seconds"},
      {"time_s.pipeline", "number", "every step", "forward + backward through the pipeline schedule"},
      {"time_s.compute", "number", "every step", "computing inside it"},
      {"time_s.bubble", "number", "every step", "waiting for other stages inside it"},
      {"time_s.grad_sync", "number", "every step", "gradient all-reduce / reduce-scatter"},
      {"time_s.optimizer", "number", "every step", "AdamW (and ZeRO-1's all-gather)"},
      {"time_s.all_to_all", "number", "every step", "the token exchange, the worst stage's"},
      {"time_s.moe", "object: MoE step name -> seconds", "--profile", "the MoE layers' steps on rank 0"},
      {"a2a_rank_s", "list of numbers", "every step", "each world rank's own exchange seconds"},
      {"ranks_per_node", "integer", "every step", "of the run's topology (a2a_rank_s's node = rank / this)"},
      {"a2a_bytes", "object", "every step", "exchange bytes by link class, summed over the world"},
      {"a2a_bytes.same_rank", "integer", "every step", "rows that stayed on their rank"},
      {"a2a_bytes.intra_node", "integer", "every step", "between ranks of a node"},
      {"a2a_bytes.inter_node", "integer", "every step", "between nodes of a switch group"},
      {"a2a_bytes.inter_group", "integer", "every step", "between switch groups"},
      {"activation_peak_bytes", "integer", "every step", "rank 0's activation high-water mark"},
      {"optimizer_bytes", "list of numbers", "every step", "AdamW state bytes of each world rank"},
      {"moe_dispatch_bytes", "list of numbers", "every step",
       "each world rank's largest micro-batch's MoE dispatch buffers"},
      {"stages", "list of objects", "every step", "one per pipeline stage: its slowest rank's figures"},
      {"stages[].stage", "integer", "every step", "stage index"},
      {"stages[].layers", "integer", "every step", "decoder layers of the stage"},
      {"stages[].compute_s", "number", "every step", "seconds computing"},
      {"stages[].bubble_s", "number", "every step", "seconds waiting for other stages"},
      {"stages[].all_to_all_s", "number", "every step", "seconds in the token exchange"},
      {"stages[].step_s", "number", "every step", "seconds of the pipeline schedule"},
      {"stages[].activation_peak_bytes", "number", "every step", "activation high-water mark"},
      {"stages[].total_peak_bytes", "number", "every step", "high-water mark of all device buffers"},
      {"stages[].max_in_flight", "integer", "every step", "micro-batches whose activations were held at once"},
      {"expert_loads", "list of lists of integers", "every step",
       "tokens per logical expert of every MoE layer, global batch (empty for a dense model)"},
      {"expert_loads_layers", "list of integers", "every step", "the layer index of each row of expert_loads"},
      {"rank_loads", "list of lists of numbers", "--ep > 1",
       "tokens per EP rank of every MoE layer under this step's placement"},
      {"load_imbalance", "list of numbers", "--ep > 1", "max / mean of each row of rank_loads (1 = balanced)"},
      {"migration", "object", "a step after which experts moved (--balance.migrate-every)",
       "the move, done before the next step"},
      {"migration.layers", "list of objects", "with migration", "the layers that moved experts, ascending"},
      {"migration.layers[].layer", "integer", "with migration", "layer index"},
      {"migration.layers[].swaps", "integer", "with migration", "expert swaps of the hill climb"},
      {"migration.layers[].imbalance_before", "number", "with migration",
       "load_imbalance of the window's loads under the old placement"},
      {"migration.layers[].imbalance_after", "number", "with migration", "the same under the new placement"},
      {"migration.bytes_moved", "number", "with migration", "weights and AdamW state sent, all ranks"},
      {"migration.seconds", "number", "with migration", "the slowest rank's time for the move"},
      {"time_budget", "object", "--time-budget: the step that chose the count",
       "steps = min(--steps, step + floor((budget_s - spent_s) / step_time_s))"},
      {"time_budget.budget_s", "number", "with time_budget", "--time-budget in seconds"},
      {"time_budget.step_time_s", "number", "with time_budget", "median timed warm-up step, the slowest rank's"},
      {"time_budget.timed_steps", "integer", "with time_budget", "warm-up steps timed by this process"},
      {"time_budget.spent_s", "number", "with time_budget", "training seconds spent so far"},
      {"time_budget.steps", "integer", "with time_budget", "the step count chosen"},
      {"val_loss", "number", "evaluation steps (--eval-every, the last step)",
       "held-out cross-entropy, nats per token"},
      {"val_loss_nats_per_byte", "number", "evaluation steps of tokenized data with a known bytes/token",
       "val_loss / bytes per token"},
      {"val_loss_start", "number", "the first line of a train --init-from run",
       "the loaded weights' held-out loss before step 1 (moetrain eval of the folder)"},
  };
  return fields;
}

std::string metrics_doc_markdown() {
  std::string s =
      "# metrics.jsonl\n\n"
      "<!-- Generated from src/train/step_record.cpp (step_record_fields) by build/tool_metrics_doc;\n"
      "     do not edit by hand: `build/tool_metrics_doc > docs/metrics.md`. ctest metrics_doc checks it. -->\n\n"
      "`moetrain train` writes one JSON object per optimizer step to `<out>/metrics.jsonl` (rank 0), in\n"
      "step order; a resumed run appends, so a step can appear twice (the later line wins in\n"
      "`moetrain report`). Every line is a step record; there is no header or event line. The trainer\n"
      "writes it and the report reads it through one schema, `train::StepRecord` (src/train/step_record.h).\n\n"
      "Reading older files: every field but `step` may be absent (a number reads as NaN, a list as\n"
      "empty, an object as not there), and the report leaves out what a file lacks. A non-finite\n"
      "number is written as `null`. A path `a.b` is field `b` of object `a`; `a[].b` is field `b` of\n"
      "each object in list `a`.\n\n"
      "| field | type | written | meaning |\n|---|---|---|---|\n";
  for (const FieldDoc& f : step_record_fields())
    s += str_cat("| `", f.path, "` | ", f.type, " | ", f.written, " | ", f.meaning, " |\n");
  return s;
}

}  // namespace moe::train
