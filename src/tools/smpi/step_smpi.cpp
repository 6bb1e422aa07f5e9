// moetrain_smpi_step: one training step of a layout on a simulated platform (SimGrid SMPI,
// -DMOETRAIN_SMPI=ON, build-smpi/), communication only. Every rank runs the step's communication
// for real: per MoE layer and micro-batch the plan, dispatch (multicast) and combine (reduce) of
// comm::TokenExchange (random uniform routing as bench a2a, the layout's EP group and exchange),
// the same again in backward (plus once more with recomputation), the pipeline's sends between
// stages on the 1F1B/GPipe schedule the trainer runs, then the gradient all-reduces over the dp and
// data groups (parallel::make_grid's communicators) with the planner's byte counts. Compute is not
// executed: its duration, from the planner's time model of the same step (smpi/step_spec.h), is
// injected as simulated time (smpi_execute_flops at the host's speed), so the simulated step
// shows communication against a realistic compute time and compares with the planner's step.
//   smpirun -np 64 -platform frontier-8.xml -hostfile frontier-8.hosts
//     build-smpi/moetrain_smpi_step --topo.ranks-per-node 8 --model xmoe-small
//     --tokens-per-rank 512 [--layout "pp=2,dp=2,ep=16,mb=4,a2a=rbd"] [--json]
// Without --layout the planner's own search picks the layout for the world size (printed).
// Buffers are SMPI shared memory (SMPI_SHARED_MALLOC; run with smpi/shared-malloc:local and
// smpi/auto-shared-malloc-thresh for the exchange's own buffers), so row contents are garbage and
// are not checked; every plan's counts are (each received pair's expert lives on its receiver, and
// each EP group receives exactly tokens x k pairs). The exchange keeps its staging rows between
// calls (keep_staging) and copies no rows (set_copy_rows(false)): every message keeps its size,
// and the host does not pack, unpack or sum rows nobody reads.
// The all-reduce runs as the trainer's (parallel::sync_gradients): in two levels where they apply
// (comm/two_level.h: a ring reduce-scatter inside the node, a ring all-reduce of each member's
// share across the nodes, a ring all-gather inside the node), else one ring (reduce-scatter +
// all-gather, 2(g-1) steps of 1/g of the buffer to the next rank). Each is Group sends: the
// traffic of the planner's ring models without their arithmetic (MPI_Allreduce would apply the
// sum on the host to every rank's buffer, and its temporaries are not folded: 1024 ranks do not
// fit).
#include "tools/smpi/smpi_cli.h"  // first: CLI11 without smpicxx's exit macro
#include <simgrid/host.h>
#include <smpi/smpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "balance/placement.h"
#include "tools/bench_a2a.h"
#include "comm/mpi_runtime.h"
#include "comm/sim_overhead.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "parallel/grid.h"
#include "tools/smpi/step_report.h"

namespace moe::smpi {
namespace {

// A float array in SMPI shared memory (all ranks' arrays of one call site share pages).
class SharedFloats {
 public:
  explicit SharedFloats(size_t n) : n_(n) {
    if (n_) p_ = static_cast<float*>(SMPI_SHARED_MALLOC(n_ * sizeof(float)));
    MOE_CHECK(n_ == 0 || p_, "SMPI_SHARED_MALLOC of ", n_ * sizeof(float), " bytes failed");
  }
  ~SharedFloats() {
    if (p_) SMPI_SHARED_FREE(p_);
  }
  SharedFloats(const SharedFloats&) = delete;
  SharedFloats& operator=(const SharedFloats&) = delete;
  float* data() { return p_; }
  size_t size() const { return n_; }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

void inject(double seconds, double& total) {
  if (seconds <= 0) return;
  smpi_execute_flops(seconds * sg_host_get_speed(sg_host_self()));
  total += seconds;
}

// `steps` ring steps over g: each sends 1/g of `count` floats to the next rank and receives as
// much from the previous one. buf holds at least 2 chunks.
void ring_traffic(const comm::Group& g, float* buf, int64_t count, int steps) {
  const int n = g.size(), r = g.rank();
  if (n <= 1 || count <= 0) return;
  const int64_t chunk = (count + n - 1) / n;
  for (int step = 0; step < steps; ++step) {
    std::vector<comm::Request> reqs;
    reqs.push_back(g.irecv(buf + chunk, chunk, (r + n - 1) % n, step));
    reqs.push_back(g.isend(buf, chunk, (r + 1) % n, step));
    comm::wait_all(reqs);
  }
}

// The gradient all-reduce's traffic, as comm::allreduce_sum runs it: two levels where they apply
// (reduce-scatter in the node: g_n − 1 ring steps; the share's all-reduce across nodes: 2(n − 1);
// all-gather in the node: g_n − 1), else one ring of 2(g − 1) steps.
void allreduce_traffic(const comm::Group& g, const comm::NodeSplit& s, float* buf, int64_t count) {
  if (!s.applies(g, count)) return ring_traffic(g, buf, count, 2 * (g.size() - 1));
  const int r = s.per_node;
  ring_traffic(s.node, buf, count, r - 1);
  ring_traffic(s.cross, buf, (count + r - 1) / r, 2 * (s.nodes - 1));
  ring_traffic(s.node, buf, count, r - 1);
}

int64_t floats_of(double bytes) { return static_cast<int64_t>(std::ceil(bytes / 4)); }

class StepRunner {
 public:
  StepRunner(const StepSpec& sp, const parallel::Grid& g, A2a algo, uint64_t seed)
      : sp_(sp), g_(g), st_(sp.stages[g.me.pp]), ex_(g.ep, g.topo, algo, nullptr),
        N_(static_cast<int>(sp.rank.tokens)), H_(sp.row_floats), p2p_n_(floats_of(sp.p2p_floats * 4)),
        src_(static_cast<size_t>(N_) * H_), act_(static_cast<size_t>(p2p_n_) * 2),
        grads_(grad_floats() * 2 + 2) {
    MOE_CHECK(sp.rank.tokens < (1 << 24), "moetrain_smpi_step: ", sp.rank.tokens,
              " tokens per micro-batch is too many (max 2^24)");
    const int ep = g.ep.size();
    for (size_t l = 0; l < st_.layers.size(); ++l) {
      if (!st_.layers[l].moe || ep <= 1) {
        routes_.emplace_back();
        continue;
      }
      const uint64_t stream = static_cast<uint64_t>(g.world.rank()) * 4096 + st_.first_layer + l;
      routes_.push_back(comm::make_a2a_routing(sp.model.experts, sp.model.top_k, "uniform", N_, ep,
                                               derive_rng(seed, stream)));
    }
    plans_.resize(st_.layers.size());
    ex_.keep_staging(true);    // the staging rows are mapped and faulted in once, not every call
    ex_.set_copy_rows(false);  // rows are placeholders here: their sizes travel, not their bytes
  }

  StepTimes run() {
    StepTimes t;
    const std::vector<plan::PipeOpSpec> ops =
        plan::schedule_ops(sp_.layout.schedule, sp_.layout.pp, g_.me.pp, sp_.layout.micro_batches);
    g_.world.barrier();
    const double t0 = now_seconds();
    for (const plan::PipeOpSpec& op : ops) {
      if (op.forward) forward(op.micro_batch, t);
      else backward(op.micro_batch, t);
    }
    {
      ScopedTimer timer(t.p2p);
      comm::wait_all(sends_);
    }
    {
      ScopedTimer timer(t.allreduce);
      for (const GradCall& c : st_.grads)
        allreduce_traffic(c.experts ? g_.dp : g_.data, c.experts ? g_.dp_nodes : g_.data_nodes, grads_.data(),
                          floats_of(c.bytes));
    }
    inject(st_.optimizer_s, t.optimizer);
    t.step = now_seconds() - t0;
    t.wrong = wrong_;
    t.exchanges = exchanges_;
    return t;
  }

 private:
  int64_t grad_floats() const {
    double most = 0;
    for (const GradCall& c : sp_.stages[g_.me.pp].grads) most = std::max(most, c.bytes);
    return floats_of(most);
  }

  bool exchanges(size_t l) const { return st_.layers[l].moe && g_.ep.size() > 1; }

  // The plan's counts, exactly: every received pair's expert lives here; the group receives T·k.
  void check_plan(const comm::ExchangePlan& plan) {
    const balance::LayerPlacement place = balance::LayerPlacement::contiguous(sp_.model.experts, g_.ep.size());
    for (int i = 0; i < plan.num_recv; ++i) wrong_ += place.rank_of(plan.recv_tag[i]) != g_.ep.rank();
    int64_t got = plan.num_recv;
    g_.ep.allreduce_sum(&got, 1);
    wrong_ += std::llabs(got - static_cast<int64_t>(N_) * sp_.model.top_k * g_.ep.size());
  }

  // Layer l's exchange plan from its routing (the counts, then the metadata: a2a time).
  void plan_layer(size_t l, StepTimes& t) {
    const comm::A2aRouting& r = routes_[l];
    ScopedTimer timer(t.a2a);
    plans_[l] = ex_.plan(N_, static_cast<int>(r.dst.size()), r.src_row.data(), r.dst.data(), r.tag.data(),
                         r.value.data());
  }

  // One round trip of layer l's rows: out to the experts, compute, back (forward: dispatch, FFN,
  // combine; backward: combine's adjoint, FFN backward, dispatch's adjoint).
  void round_trip(size_t l, double ffn_s, StepTimes& t) {
    const comm::ExchangePlan& plan = plans_[l];
    const size_t need = static_cast<size_t>(plan.num_recv) * H_;
    if (!rows_ || rows_->size() < need) rows_ = std::make_unique<SharedFloats>(need + need / 4);
    SharedFloats& rows = *rows_;
    {
      ScopedTimer timer(t.a2a);
      ex_.multicast(plan, src_.data(), rows.data(), H_);
    }
    inject(ffn_s, t.compute);
    ScopedTimer timer(t.a2a);
    ex_.reduce(plan, rows.data(), src_.data(), H_);
    exchanges_ += 2;
  }

  void forward(int mb, StepTimes& t) {
    const int s = g_.me.pp;
    if (s > 0) {
      ScopedTimer timer(t.p2p);
      g_.pp.recv(act_.data(), p2p_n_, s - 1, 2 * mb);
    }
    for (size_t l = 0; l < st_.layers.size(); ++l) {
      const LayerWork& w = st_.layers[l];
      inject(w.attn_fwd, t.compute);
      if (!exchanges(l)) {
        inject(w.ffn_fwd, t.compute);
        continue;
      }
      plan_layer(l, t);
      if (mb == 0) check_plan(plans_[l]);
      round_trip(l, w.ffn_fwd, t);
    }
    if (s + 1 < sp_.layout.pp) sends_.push_back(g_.pp.isend(act_.data(), p2p_n_, s + 1, 2 * mb));
  }

  void backward(int mb, StepTimes& t) {
    const int s = g_.me.pp;
    if (s + 1 < sp_.layout.pp) {
      ScopedTimer timer(t.p2p);
      g_.pp.recv(act_.data() + p2p_n_, p2p_n_, s + 1, 2 * mb + 1);
    }
    for (size_t l = st_.layers.size(); l-- > 0;) {
      const LayerWork& w = st_.layers[l];
      if (!exchanges(l)) {
        inject(w.ffn_bwd + w.attn_bwd, t.compute);
        continue;
      }
      // Recomputation replays the layer's forward: its routing again, so a new plan (as the
      // trainer's recomputed forward and the planner's charge), then its exchanges (their
      // compute is in ffn_bwd).
      if (sp_.layout.recompute != Recompute::kNone) {
        plan_layer(l, t);
        round_trip(l, 0, t);
      }
      round_trip(l, w.ffn_bwd, t);
      inject(w.attn_bwd, t.compute);
    }
    if (s > 0) sends_.push_back(g_.pp.isend(act_.data() + p2p_n_, p2p_n_, s - 1, 2 * mb + 1));
  }

  const StepSpec& sp_;
  const parallel::Grid& g_;
  const StageSpec& st_;
  comm::TokenExchange ex_;
  int N_, H_;
  int64_t p2p_n_;  // floats of one pipeline message (forward activations or their gradient)
  SharedFloats src_, act_, grads_;
  std::unique_ptr<SharedFloats> rows_;  // received rows, grown to the largest plan
  std::vector<comm::A2aRouting> routes_;
  std::vector<comm::ExchangePlan> plans_;
  std::vector<comm::Request> sends_;
  int64_t wrong_ = 0, exchanges_ = 0;
};

struct Cli {
  StepRequest req;
  int ranks_per_node = 0, nodes_per_group = 0;
  double overhead_us = 0;
  uint64_t seed = 1;
  bool json = false;
};

void add_options(CLI::App& app, Cli& a) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", a.req.model, "planner preset or a Hugging Face config.json")->capture_default_str();
  app.add_option("--cluster", a.req.cluster, "cluster profile of the simulated platform")->capture_default_str();
  app.add_option("--tokens-per-rank", a.req.tokens_per_rank, "tokens per step / ranks (weak scaling)")->required();
  app.add_option("--seq-len", a.req.seq_len, "tokens per sequence (default: the model's)");
  app.add_option("--layout", a.req.layout, "\"pp=..,dp=..,ep=..,mb=..,recompute=..,a2a=..\" (default: the planner's search)");
  app.add_option("--topo.ranks-per-node", a.ranks_per_node, "ranks per simulated node");
  app.add_option("--topo.nodes-per-group", a.nodes_per_group, "nodes per switch group");
  app.add_option("--msg-overhead-us", a.overhead_us,
                 "simulated CPU time per message sent and received (us); the planner plans with 2x this per message")
      ->capture_default_str();
  app.add_option("--seed", a.seed, "routing seed")->capture_default_str();
  app.add_flag("--json", a.json, "print JSON instead of a table");
}

int run(Cli& a, comm::MpiRuntime& mpi) {
  // Bad options and layouts fail alike on every rank (each builds the same spec): rank 0 names
  // them and every rank returns 1 (smpirun reports a rank's exit status, not an MPI_Abort).
  StepSpec sp;
  try {
    MOE_CHECK(std::isfinite(a.overhead_us), "--msg-overhead-us must be finite, got ", a.overhead_us);
    comm::set_sim_message_overhead(a.overhead_us * 1e-6);
    // The planner plans for the simulated platform: a message costs its overhead at both ends
    // (scale_study_report.py's --per-message-us likewise), not the preset's MPI-class latency.
    a.req.per_message_s = 2 * a.overhead_us * 1e-6;
    a.req.world = mpi.world_size();
    sp = make_step_spec(a.req);
  } catch (const std::exception& e) {
    if (mpi.world_rank() == 0) std::fprintf(stderr, "moetrain_smpi_step: error: %s\n", e.what());
    return 1;
  }
  try {
    parallel::ParallelDims dims{sp.layout.pp, sp.layout.dp, sp.layout.ep, sp.layout.tp};
    parallel::Grid g = parallel::make_grid(dims, plan::shadow_config(sp.model), a.ranks_per_node, a.nodes_per_group);
    StepRunner runner(sp, g, sp.layout.a2a, a.seed);
    const StepTimes mine = runner.run();
    const StepResult res = gather_step(sp, g.world, mine, a.overhead_us);
    if (g.world.rank() == 0) std::printf("%s\n", a.json ? step_json(res).c_str() : step_table(res).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain_smpi_step: error (rank %d of %d): %s\n", mpi.world_rank(), mpi.world_size(),
                 e.what());
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

}  // namespace
}  // namespace moe::smpi

int main(int argc, char** argv) {
  moe::smpi::Cli a;
  CLI::App app{"one training step, communication only, under SimGrid SMPI (run with smpirun)"};
  moe::smpi::add_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli_exit(app, e);
  }
  moe::comm::MpiRuntime mpi(&argc, &argv);
  return moe::smpi::run(a, mpi);
}
