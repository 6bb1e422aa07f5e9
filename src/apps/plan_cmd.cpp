// `moetrain plan` / `moetrain calibrate`. See plan_cmd.h.
#include "apps/plan_cmd.h"

#include <sstream>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli_checks.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "io/output_file.h"
#include "plan/cluster.h"
#include "plan/plan_model.h"
#include "plan/report.h"
#include "plan/search.h"

namespace moe::apps {

void add_plan_commands(CLI::App& app, PlanCli& s) {
  CLI::App* p = add_command(app, "plan", "resource model: which layout fits, and how fast it runs");
  p->add_option("--model", s.model, "preset (xmoe-small..super, piper-110b/862b/1.7t, mixtral-8x7b/8x22b, "
                                    "deepseek-v2/v3, tiny, ...) or a Hugging Face config.json")
      ->capture_default_str();
  p->add_option("--cluster", s.cluster, "frontier, dgx-h100, or a profile.json from moetrain calibrate")->capture_default_str();
  p->add_option("--gpus", s.gpus, "world size (GPUs or ranks)");
  p->add_option("--seq-len", s.seq_len, "tokens per sequence (default: the model's training length)");
  p->add_option("--global-batch", s.global_batch, "sequences per step (default: 2 per rank)");
  p->add_option_function<std::string>(
      "--precision", [&s](const std::string& v) { s.precision = parse_precision(v, "--precision"); },
      "bf16 (mixed precision) or fp32 (default: the cluster's)");
  p->add_option("--top", s.top, "plans to list")->capture_default_str();
  p->add_option("--max-tp", s.max_tp, "largest tensor-parallel degree to consider")->capture_default_str();
  p->add_option("--max-micro-batches", s.max_micro_batches, "largest micro-batch count to consider")->capture_default_str();
  p->add_option("--imbalance", s.imbalance, "expert rows on the busiest rank / the balanced mean")->capture_default_str();
  p->add_option("--loads", s.loads, "a metrics.jsonl of this model: its expert_loads give the routing imbalance per EP degree");
  p->add_option("--save-cluster", s.save_cluster,
                "write the --cluster profile (a preset or a file) as profile.json and stop: a start for describing another cluster");
  p->add_option("--gemm", s.gemm,
                "FORM:MxNxK,... (FORM nt|nn|tn): print the GEMM rate the time model reads from --cluster's tables and stop");
  p->add_flag("--explain", s.explain, "why each rejected family was rejected; padded vs padding-free dispatch memory");
  p->add_flag("--json", s.json, "print JSON");
  p->add_flag("--zero1", s.zero1, "shard the optimizer state over the data ranks (ZeRO-1)");
  p->add_flag("--evaluate", s.evaluate, "predict the one layout given by --layout instead of searching");
  p->add_option("--layout", s.layout, "with --evaluate: \"pp=2,ep=2,dp=1,mb=4,recompute=moe,a2a=flat\"");

  CLI::App* c = add_command(app, "calibrate", "measure this machine for the planner (run under mpirun per rank count)");
  c->add_option("-o,--out", s.calibrate.out, "profile file to write")->capture_default_str();
  c->add_flag("--append", s.calibrate.append, "add this rank count's sharing and communication curves to an existing profile");
  c->add_option("--ranks-per-node", s.calibrate.ranks_per_node, "emulate nodes of this many ranks for the exchange benchmarks");
  c->add_option("--nodes-per-group", s.calibrate.nodes_per_group, "emulate switch groups of this many nodes");
  c->add_option("--threads", s.calibrate.threads, "BLAS threads per rank")->capture_default_str();
  c->add_flag("--quick", s.calibrate.quick, "small grids, few iterations (tests)");
  c->add_flag("--quiet", s.calibrate_quiet, "no progress output");
}

namespace {

// The numbers given on the command line, before any model or cluster is read. Each error names the
// flag and the value; non-finite values are refused wherever a number is read.
void validate_plan_flags(const PlanCli& s) {
  MOE_CHECK(s.seq_len >= 0, "--seq-len must be positive, got ", s.seq_len);
  MOE_CHECK(s.global_batch >= 0, "--global-batch must be positive, got ", s.global_batch);
  MOE_CHECK(s.gpus >= 0, "--gpus must be >= 1, got ", s.gpus);
  MOE_CHECK(s.top >= 1, "--top must be >= 1, got ", s.top);
  MOE_CHECK(s.max_tp >= 1, "--max-tp must be >= 1, got ", s.max_tp);
  MOE_CHECK(s.max_micro_batches >= 1, "--max-micro-batches must be >= 1, got ", s.max_micro_batches);
  MOE_CHECK(std::isfinite(s.imbalance) && s.imbalance >= 1.0 && s.imbalance <= 1e6,
            "--imbalance must be a finite number >= 1 (rows on the busiest rank / the mean), got ", s.imbalance);
}

int run_plan(const PlanCli& s) {
  validate_plan_flags(s);
  // --save-cluster: a new or regular file, none of the files this run reads (io/output_file.h),
  // checked before anything is read.
  if (!s.save_cluster.empty()) io::check_output_path(s.save_cluster, "--save-cluster", {s.cluster, s.model, s.loads});
  plan::PlanModel m = plan::resolve_model(s.model);
  plan::ClusterProfile c = plan::resolve_cluster(s.cluster);
  if (!s.save_cluster.empty()) {
    plan::save_profile(c, s.save_cluster, "--save-cluster");
    std::printf("cluster %s written to %s\n", c.name.c_str(), s.save_cluster.c_str());
    return 0;
  }
  if (!s.gemm.empty()) {
    std::printf("%-4s %8s %8s %8s  %s\n", "form", "m", "n", "k", "TFLOP/s");
    std::stringstream list(s.gemm);
    for (std::string item; std::getline(list, item, ',');) {
      const size_t colon = item.find(':');
      const std::string form = item.substr(0, colon == std::string::npos ? 0 : colon);
      double m = 0, n = 0, k = 0;
      char x1 = 0, x2 = 0;
      std::istringstream dims(colon == std::string::npos ? "" : item.substr(colon + 1));
      const bool ok = static_cast<bool>(dims >> m >> x1 >> n >> x2 >> k) && x1 == 'x' && x2 == 'x' && dims.eof() &&
                      m >= 1 && n >= 1 && k >= 1 && m <= 1e9 && n <= 1e9 && k <= 1e9;  // NaN and Inf fail too
      MOE_CHECK(ok && (form == "nt" || form == "nn" || form == "tn"), "--gemm: '", item,
                "' is not FORM:MxNxK with FORM nt, nn or tn and sizes in [1, 1e9]");
      const plan::GemmTable& t = form == "nt" ? c.gemm_nt : (form == "nn" ? c.gemm_nn : c.gemm_tn);
      std::printf("%-4s %8.0f %8.0f %8.0f  %.1f\n", form.c_str(), m, n, k, t.gflops_at(m, n, k) * 1e-3);
    }
    return 0;
  }
  plan::TrainShape shape;
  shape.seq_len = s.seq_len > 0 ? s.seq_len : m.default_seq_len;
  MOE_CHECK(s.seq_len >= 0, "--seq-len must be positive, got ", s.seq_len);
  MOE_CHECK(s.global_batch >= 0, "--global-batch must be positive, got ", s.global_batch);
  MOE_CHECK(s.top >= 1, "--top must be >= 1, got ", s.top);
  MOE_CHECK(s.max_tp >= 1, "--max-tp must be >= 1, got ", s.max_tp);
  MOE_CHECK(s.imbalance >= 1.0, "--imbalance must be >= 1 (rows on the busiest rank / the mean), got ", s.imbalance);
  shape.precision = s.precision.value_or(c.precision);
  if (m.max_position_embeddings > 0)
    MOE_CHECK(shape.seq_len <= m.max_position_embeddings, "--seq-len ", shape.seq_len,
              " exceeds the model's max_position_embeddings ", m.max_position_embeddings);
  plan::ReportContext ctx{&m, &c, shape, s.gpus};
  plan::RoutingStats routing;
  if (!s.loads.empty()) routing = plan::read_routing_stats(s.loads);
  const plan::RoutingStats* rp = s.loads.empty() ? nullptr : &routing;
  ctx.routing = rp;

  if (s.evaluate) {
    MOE_CHECK(!s.layout.empty(), "--evaluate needs --layout \"pp=..,dp=..,ep=..,mb=..,recompute=..,a2a=..\"");
    plan::Layout l = plan::parse_layout(s.layout);
    l.zero1 = l.zero1 || s.zero1;
    MOE_CHECK(s.gpus == 0 || s.gpus == l.world(), "--gpus ", s.gpus, " != pp(", l.pp, ") * dp(", l.dp,
              ") * ep(", l.ep, ") * tp(", l.tp, ") = ", l.world(), " of --layout");
    if (c.nodes > 0)
      MOE_CHECK(l.world() <= static_cast<long long>(c.nodes) * c.ranks_per_node, "layout needs ", l.world(),
                " ranks; cluster ", c.name, " has ", c.nodes, " node(s) x ", c.ranks_per_node);
    ctx.shape.global_batch = s.global_batch > 0 ? s.global_batch
                                                : static_cast<long long>(l.data_ranks()) * l.micro_batches;
    ctx.gpus = l.world();
    plan::Candidate cand = plan::evaluate_layout(m, c, l, ctx.shape, rp, s.imbalance);
    if (s.json) {
      nlohmann::json j = plan::candidate_json(ctx, cand);
      j["model"] = m.name;
      j["cluster"] = c.name;
      j["seq_len"] = ctx.shape.seq_len;
      j["global_batch"] = ctx.shape.global_batch;
      j["precision"] = name(ctx.shape.precision);
      if (rp) j["loads"] = plan::loads_json(*rp);
      if (s.explain && m.num_moe_layers() > 0) j["dispatch"] = plan::padded_json(ctx, cand);
      std::printf("%s\n", j.dump(1).c_str());
    } else {
      std::printf("%s", plan::format_evaluation(ctx, cand).c_str());
      if (s.explain) {
        plan::SearchResult none;
        std::printf("%s", plan::format_explain(ctx, none, &cand).c_str());
      }
    }
    return cand.fits ? 0 : 3;
  }

  MOE_CHECK(s.gpus >= 1, "--gpus must be given and >= 1 (got ", s.gpus, "), or use --evaluate --layout");
  ctx.shape.global_batch = s.global_batch > 0 ? s.global_batch : 2LL * s.gpus;
  const plan::SearchOptions so{.gpus = s.gpus,
                               .shape = ctx.shape,
                               .zero1 = s.zero1,
                               .top = s.top,
                               .max_tp = s.max_tp,
                               .max_micro_batches = s.max_micro_batches,
                               .imbalance = s.imbalance,
                               .routing = rp};
  plan::SearchResult r = plan::search_plans(m, c, so);
  if (s.json) {
    std::printf("%s\n", plan::search_json(ctx, r, s.explain).dump(1).c_str());
  } else {
    std::printf("%s", plan::format_plans(ctx, r).c_str());
    if (s.explain) std::printf("%s", plan::format_explain(ctx, r, r.best.empty() ? nullptr : &r.best.front()).c_str());
  }
  return r.best.empty() ? 3 : 0;
}

int run_calibrate_cli(PlanCli& s, int* argc, char*** argv) {
  comm::MpiRuntime mpi(argc, argv);
  try {
    s.calibrate.verbose = !s.calibrate_quiet;
    train::run_calibrate(s.calibrate);
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    if (mpi.world_rank() == 0) std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    std::fflush(stderr);
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

}  // namespace

int run_plan_commands(CLI::App& app, PlanCli& s, int* argc, char*** argv) {
  if (app.got_subcommand("plan")) return run_plan(s);
  if (app.got_subcommand("calibrate")) return run_calibrate_cli(s, argc, argv);
  return -1;
}

}  // namespace moe::apps
