// The calibration run. See calibrate.h.
#include "tools/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "tools/calibrate_exchange.h"
#include "comm/group.h"
#include "comm/topology.h"
#include "core/error.h"
#include "tools/bench_driver.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/output_file.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/peak_rate.h"
#include "model/model.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/step_ops.h"
#include "plan/time_model.h"

namespace moe::train {
namespace {
using tools::median;

// Seconds per call of f in wall time, as the trainer's step is timed: the median over rounds of
// at least `min_s` (and two calls) each. On a machine shared with other work the median is the
// typical speed the trainer will see, not the best case.
template <class F>
double per_call(F f, double min_s, int rounds = 5) {
  f();  // warm-up (page faults, BLAS buffers)
  std::vector<double> r;
  for (int round = 0; round < rounds; ++round) {
    int n = 0;
    const double t0 = now_seconds();
    double t = 0;
    do {
      f();
      ++n;
      t = now_seconds() - t0;
    } while (t < min_s || n < 2);
    r.push_back(t / n);
    if (t > 10 * min_s && round >= 2) break;  // a slow shape: three rounds are enough
  }
  return median(r);
}

void fill(std::vector<float>& v, uint64_t seed) {
  Rng r(seed);
  for (float& x : v) x = static_cast<float>(r.uniform() - 0.5);
}

// GEMM throughput on a grid, for C[m,n] = op(A)[m,k] · op(B)[k,n] of one transpose form.
plan::GemmTable measure_gemm(bool ta, bool tb, bool quick) {
  plan::GemmTable t;
  t.m = quick ? std::vector<double>{16, 256, 4096} : std::vector<double>{16, 64, 256, 1024, 4096};
  t.n = quick ? std::vector<double>{32, 512} : std::vector<double>{32, 128, 512, 2048};
  t.k = t.n;
  for (double m : t.m)
    for (double n : t.n)
      for (double k : t.k) {
        const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
        std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(K) * N), C(static_cast<size_t>(M) * N);
        fill(A, 1);
        fill(B, 2);
        const double s = per_call([&] { kernels::gemm(ta, tb, M, N, K, 1.0f, A.data(), 0, B.data(), 0, 0.0f, C.data(), 0); },
                                  quick ? 0.002 : 0.005, quick ? 3 : 5);
        t.gflops.push_back(2.0 * m * n * k / s * 1e-9);
      }
  return t;
}

plan::AttentionTable measure_attention(bool quick) {
  plan::AttentionTable t;
  t.t = quick ? std::vector<double>{32, 256} : std::vector<double>{32, 64, 128, 256, 512, 1024};
  t.hd = quick ? std::vector<double>{16, 64} : std::vector<double>{16, 32, 64, 128};
  const int nh = 2;
  for (double Td : t.t)
    for (double hd : t.hd) {
      const int T = static_cast<int>(Td), D = static_cast<int>(hd), C = nh * D;
      std::vector<float> q(static_cast<size_t>(T) * C), k(q.size()), v(q.size()), out(q.size());
      std::vector<float> dq(q.size()), dk(q.size()), dv(q.size()), dout(q.size());
      std::vector<float> att(kernels::attention_saved_floats(1, T, nh, D)),
          scratch(kernels::attention_scratch_floats(T));
      fill(q, 3);
      fill(k, 4);
      fill(v, 5);
      fill(dout, 6);
      const double min_s = quick ? 0.002 : 0.01;
      const double f = per_call([&] { kernels::attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), 1, T, nh, D); }, min_s) / nh;
      // clang-format off
      const double b = per_call([&] {
        kernels::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                    v.data(), att.data(), 1, T, nh, D, scratch.data());
      }, min_s) / nh;
      // clang-format on
      t.fwd_gflops.push_back(4.0 * Td * Td * hd / f * 1e-9);
      t.bwd_gflops.push_back(8.0 * Td * Td * hd / b * 1e-9);
    }
  return t;
}

// The probe model for memory-bound work and for compute sharing: a small DeepSeek-MoE (one
// dense and one MoE layer) whose step is GEMMs, attention and everything else.
model::ModelConfig probe_config() {
  model::ModelConfig c;
  c.hidden_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 256;
  c.moe_intermediate_size = 64;
  c.n_routed_experts = 8;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.aux_loss_alpha = 0.01f;
  c.max_position_embeddings = 256;
  c.validate("calibration probe");
  return c;
}
constexpr int kProbeB = 8, kProbeT = 128;

struct ProbeTimes {
  double fwd = 0, bwd = 0;
};

// One probe model with its tokens: a timed forward + backward of B sequences.
class Probe {
 public:
  Probe(int B, Recompute rc) : c_(probe_config()), m_(c_, {}, nullptr, {}, rc), B_(B) {
    m_.init_weights(7);
    tok_.resize(static_cast<size_t>(B) * (kProbeT + 1));
    Rng r(11);
    for (int32_t& x : tok_) x = static_cast<int32_t>(r.uniform() * c_.vocab_size) % c_.vocab_size;
  }
  ProbeTimes step() {
    m_.zero_grads();
    const double t0 = now_seconds();
    m_.forward(tok_.data(), B_, kProbeT);
    const double t1 = now_seconds();
    m_.backward(1.0f);
    return {t1 - t0, now_seconds() - t1};
  }

 private:
  model::ModelConfig c_;
  model::Model m_;
  int B_;
  std::vector<int32_t> tok_;
};

// Median wall seconds per forward and backward of B sequences.
ProbeTimes time_probe(int B, int iters) {
  Probe probe(B, Recompute::kNone);
  probe.step();  // warm-up
  std::vector<double> f, b;
  for (int i = 0; i < iters; ++i) {
    const ProbeTimes t = probe.step();
    f.push_back(t.fwd);
    b.push_back(t.bwd);
  }
  return {median(f), median(b)};
}

// Runs the GEMMs and attention calls of a pass description (plan/step_ops.h) with the real
// kernels: the part of a step the tables price, measured next to the step itself.
class Replay {
 public:
  double run(const plan::PassOps& ops) {
    const double t0 = now_seconds();
    for (const plan::GemmOp& g : ops.gemms) {
      const int M = static_cast<int>(g.m), N = static_cast<int>(g.n), K = static_cast<int>(g.k);
      fit(a_, static_cast<size_t>(M) * K);
      fit(b_, static_cast<size_t>(K) * N);
      fit(c_, static_cast<size_t>(M) * N);
      const bool ta = g.form == plan::GemmForm::kTN, tb = g.form == plan::GemmForm::kNT;
      for (int i = 0; i < static_cast<int>(g.count + 0.5); ++i)
        kernels::gemm(ta, tb, M, N, K, 1.0f, a_.data(), 0, b_.data(), 0, 0.0f, c_.data(), 0);
    }
    for (const plan::AttentionOp& a : ops.attention) {
      const int T = static_cast<int>(a.seq_len), D = static_cast<int>(a.head_dim);
      const int nh = static_cast<int>(a.seq_heads + 0.5);
      const size_t n = static_cast<size_t>(T) * nh * D;
      for (auto* v : {&q_, &k_, &v_, &o_, &dq_, &dk_, &dv_}) fit(*v, n);
      fit(att_, kernels::attention_saved_floats(1, T, nh, D));
      fit(scratch_, kernels::attention_scratch_floats(T));
      if (!a.backward)
        kernels::attention_forward(o_.data(), att_.data(), q_.data(), k_.data(), v_.data(), 1, T, nh, D);
      else
        kernels::attention_backward(dq_.data(), dk_.data(), dv_.data(), o_.data(), q_.data(), k_.data(),
                                    v_.data(), att_.data(), 1, T, nh, D, scratch_.data());
    }
    return now_seconds() - t0;
  }

 private:
  static void fit(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.assign(n, 0.01f);
  }
  std::vector<float> a_, b_, c_, q_, k_, v_, o_, dq_, dk_, dv_, att_, scratch_;
};

// Memory-bound seconds per activation element, at three micro-batch sizes of the probe (keyed by
// the bytes of one [N, H] activation; cache and allocator behaviour change with it):
//   elem_fwd/bwd       (probe pass − replay of its GEMMs and attention) / elements the planner
//                      charges memory-bound work for
//   recompute_fwd/bwd  (probe with full recomputation − its replay, the recomputed forward's
//                      replay and the memory-bound work above) / elements dropped and rebuilt
// Each probe alternates with its replay, so a change of load on a shared machine hits both
// alike (medians over iterations); the two probes run one after the other, each alone in the
// allocator as the trainer's one model per process is.
void calibrate_elementwise(plan::ClusterProfile& p, bool quick) {
  const model::ModelConfig c = probe_config();
  const plan::PlanModel pm = plan::from_model_config(c, "probe", "");
  plan::ClusterProfile prof = p;
  const plan::MemoryOptions mo = plan::memory_options(prof, Precision::kFp32, false);
  p.elem_fwd = p.elem_bwd = p.recompute_fwd = p.recompute_bwd = plan::Table1D{};
  Replay replay;
  for (int B : quick ? std::vector<int>{4} : std::vector<int>{2, 8, 32}) {
    const plan::Layout none;
    plan::Layout full;
    full.recompute = Recompute::kFull;
    const plan::RankShape rs = plan::rank_shape(none, {kProbeT, B, Precision::kFp32});
    plan::PassOps layers_fwd, layers_bwd, fwd, bwd;
    double dropped = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const plan::LayerOps o = plan::layer_ops(pm, l, none, rs, kProbeT, mo);
      for (const plan::PassOps* x : {&o.attn_fwd, &o.ffn_fwd}) layers_fwd.add(*x);
      for (const plan::PassOps* x : {&o.attn_bwd, &o.ffn_bwd}) layers_bwd.add(*x);
      dropped += plan::layer_ops(pm, l, full, rs, kProbeT, mo).dropped;
    }
    fwd = layers_fwd;
    bwd = layers_bwd;
    plan::head_ops(pm, rs, none.tp, fwd, bwd);
    fwd.elems += plan::embedding_elems(pm, rs, none.tp);

    const int iters = quick ? 3 : std::max(6, 96 / B);
    std::vector<double> rf, rb, xf, xb;
    {  // The probe and the replay of its GEMMs and attention, alternating.
      Probe plain(B, Recompute::kNone);
      plain.step();
      replay.run(fwd);
      replay.run(bwd);
      for (int i = 0; i < iters; ++i) {
        const ProbeTimes t = plain.step();
        rf.push_back(t.fwd - replay.run(fwd));
        rb.push_back(t.bwd - replay.run(bwd));
      }
    }
    const double ef_raw = median(rf) / fwd.elems, eb_raw = median(rb) / bwd.elems;
    {  // The recomputing probe alone in its process's allocator (as the trainer runs it).
      Probe recompute(B, Recompute::kFull);
      recompute.step();
      for (int i = 0; i < iters; ++i) {
        const ProbeTimes t = recompute.step();
        xf.push_back(t.fwd - replay.run(fwd) - ef_raw * fwd.elems);
        xb.push_back(t.bwd - replay.run(bwd) - replay.run(layers_fwd) - eb_raw * bwd.elems -
                     ef_raw * layers_fwd.elems);
      }
    }
    // A floor of 0.05 ns keeps the term positive when noise makes a difference negative.
    const double ef = std::max(5e-11, median(rf) / fwd.elems);
    const double eb = std::max(5e-11, median(rb) / bwd.elems);
    const double size = static_cast<double>(rs.tokens) * c.hidden_size * 4;
    p.elem_fwd.x.push_back(size);
    p.elem_fwd.y.push_back(ef);
    p.elem_bwd.x.push_back(size);
    p.elem_bwd.y.push_back(eb);
    p.recompute_fwd.x.push_back(size);
    p.recompute_fwd.y.push_back(std::max(1e-13, median(xf) / dropped));
    p.recompute_bwd.x.push_back(size);
    p.recompute_bwd.y.push_back(std::max(1e-13, median(xb) / dropped));
  }
}

double measure_optimizer(bool quick) {
  const size_t n = quick ? (1u << 18) : (1u << 20);
  std::vector<float> p(n), g(n), m(n), v(n);
  fill(p, 8);
  fill(g, 9);
  kernels::AdamWParams hp;
  hp.weight_decay = 0.1f;
  int step = 0;
  // What a step does per parameter: zero the gradients, take their norm, update.
  // clang-format off
  return per_call([&] {
    std::memset(g.data(), 0, n * sizeof(float));
    volatile double s = kernels::sum_squares(g.data(), n);
    (void)s;
    kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp, ++step, 1.0f);
  }, quick ? 0.005 : 0.05) / static_cast<double>(n);
  // clang-format on
}

double measure_mem_bandwidth() {
  const size_t n = 16u << 20;  // 64 MB
  std::vector<float> a(n, 1.0f), b(n);
  const double s = per_call([&] { std::memcpy(b.data(), a.data(), n * sizeof(float)); }, 0.05);
  return 2.0 * n * sizeof(float) / s;  // read + write
}

double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page : 16e9;
}

void add_comm(plan::ClusterProfile& p, const comm::CommMeasurement& m) {
  plan::CommCurve c;
  c.op = m.op;
  c.algo = m.algo;
  c.world = m.world;
  c.group = m.group;
  c.ranks_per_node = m.ranks_per_node;
  c.seconds.x = m.bytes;
  c.seconds.y = m.seconds;
  for (double& y : c.seconds.y) y = std::max(y, 1e-9);
  auto same = [&](const plan::CommCurve& o) {
    return o.op == c.op && o.algo == c.algo && o.world == c.world && o.group == c.group &&
           o.ranks_per_node == c.ranks_per_node;
  };
  p.comm.erase(std::remove_if(p.comm.begin(), p.comm.end(), same), p.comm.end());
  p.comm.push_back(c);
}

// Sets table(x) = y, keeping the other points (x ascending).
void set_point(plan::Table1D& t, double x, double y) {
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < t.x.size(); ++i)
    if (t.x[i] != x) pts.emplace_back(t.x[i], t.y[i]);
  pts.emplace_back(x, y);
  std::sort(pts.begin(), pts.end());
  t.x.clear();
  t.y.clear();
  for (auto& [px, py] : pts) {
    t.x.push_back(px);
    t.y.push_back(py);
  }
}

// 1. Compute, one rank alone (the others wait): GEMM and attention tables, the sgemm peak, memory
// bandwidth, the optimizer, the memory-bound probe, and one machine's link defaults.
void calibrate_compute(plan::ClusterProfile& p, const CalibrateOptions& o, const std::function<void(const std::string&)>& say) {
  say("GEMM tables (nt, nn, tn) ...");
  p.name = o.out;
  p.kind = NodeKind::kCpu;
  p.precision = Precision::kFp32;
  p.fused_attention = true;  // kernels/attention.cpp keeps no T×T probabilities
  p.gemm_nt = measure_gemm(false, true, o.quick);
  p.gemm_nn = measure_gemm(false, false, o.quick);
  p.gemm_tn = measure_gemm(true, false, o.quick);
  say("attention table ...");
  p.attention = measure_attention(o.quick);
  // The sgemm rate the trainer's MFU refers to: the same measurement (kernels/peak_rate.h).
  p.peak_flops = 1e9 * (o.quick ? kernels::measure_peak_gflops(Precision::kFp32, {256}, 3)
                                : kernels::measure_peak_gflops(Precision::kFp32));
  p.mem_bandwidth = measure_mem_bandwidth();
  p.optimizer_s_per_param = measure_optimizer(o.quick);
  say("memory-bound probe ...");
  calibrate_elementwise(p, o.quick);
  p.cores_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.hbm_bytes = physical_memory();
  p.reserved_bytes = 0;
  p.nodes = 1;
  p.ranks_per_node = 1;
  p.fast_domain_nodes = 1;
  p.nodes_per_group = 0;
  p.nics_per_node = 1;
  // One machine: every "link" is shared memory (p2p below refines it).
  p.intra_node = p.inter_node = p.inter_group = {p.mem_bandwidth / 2, 2e-6};
  p.nic_bandwidth = p.mem_bandwidth / 2;
  set_point(p.compute_share, 1, 1.0);
  p.notes = "measured by moetrain calibrate on this machine (fp32 trainer kernels, 1 BLAS thread per rank)";
}

// 2. Compute sharing (n > 1 ranks): the probe step on one rank alone (the others sleep), then on
// every rank at once; three rounds, the median ratio (the load of a shared machine drifts).
void calibrate_sharing(plan::ClusterProfile& p, const CalibrateOptions& o, const comm::Group& world,
                       const std::function<void(const std::string&)>& say) {
  const int n = world.size();
  const bool root = world.rank() == 0;
  std::vector<double> ratios;
  for (int round = 0; round < (o.quick ? 1 : 3); ++round) {
    double alone = 0;
    if (root) {
      ProbeTimes t = time_probe(kProbeB, o.quick ? 2 : 5);
      alone = t.fwd + t.bwd;
    }
    comm::quiet_barrier();
    world.barrier();
    ProbeTimes t = time_probe(kProbeB, o.quick ? 2 : 5);
    std::vector<double> all(n);
    double mine = t.fwd + t.bwd;
    world.allgather(&mine, all.data(), 1);
    ratios.push_back(alone / median(all));
  }
  if (root) {
    const double share = median(ratios);
    set_point(p.compute_share, n, share);
    say(str_cat(n, " ranks at once: each runs the probe step at ", share, " of one rank alone"));
  }
}

// 3. Communication at this rank count (n > 1): p2p, all-reduce and the four all-to-alls, and the
// link figures the p2p curves give.
void calibrate_comm(plan::ClusterProfile& p, const CalibrateOptions& o, const comm::Group& world,
                    const comm::Topology& topo, const std::function<void(const std::string&)>& say) {
  const int n = world.size();
  const double big = o.quick ? 1 << 20 : 16 << 20;
  const int iters = o.quick ? 3 : 10;
  std::vector<comm::CommMeasurement> ms;
  say("p2p, all-reduce, all-to-all ...");
  ms.push_back(comm::measure_p2p(world, 4096, big, iters));
  std::optional<comm::CommMeasurement> inter;
  if (o.ranks_per_node == 0 && topo.num_nodes() > 1 && topo.num_nodes() % 2 == 0)
    inter = comm::measure_p2p(world, 4096, big, iters, topo.ranks_per_node);
  for (int g = 2; g <= n; ++g) {
    if (n % g != 0) continue;
    ms.push_back(comm::measure_allreduce(world, g, 4096, o.quick ? 1 << 20 : 64 << 20, iters));
    for (auto& m : comm::measure_a2a(world, topo, g, {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo}, 16384, big,
                                     o.quick ? 64 : 128, 2, iters))
      ms.push_back(m);
  }
  if (world.rank() != 0) return;
  for (const auto& m : ms) add_comm(p, m);
  // Link figures from the p2p curve: latency of the smallest message, bandwidth of the largest.
  const comm::CommMeasurement& pp = ms.front();
  const double lat = pp.seconds.front(), bw = pp.bytes.back() / pp.seconds.back();
  if (o.ranks_per_node == 0 || o.ranks_per_node >= n) {
    p.intra_node = {bw, lat};
  }
  p.inter_node = p.inter_group = {bw, lat};
  // Real nodes (the launcher's, not emulated ones): the links between them are measured apart,
  // rank j of one node with rank j of the next, all pairs at once (each node's uplink is shared).
  if (inter) {
    const double ilat = inter->seconds.front(), ibw = inter->bytes.back() / inter->seconds.back();
    p.inter_node = p.inter_group = {ibw, ilat};
    say(str_cat("between nodes: ", ibw * 1e-6, " MB/s per rank and direction, ", ilat * 1e6,
                " us per message; inside a node: ", bw * 1e-6, " MB/s, ", lat * 1e6, " us"));
  }
  p.nic_bandwidth = p.inter_node.bandwidth;
  p.ranks_per_node = std::max(p.ranks_per_node, o.ranks_per_node > 0 ? o.ranks_per_node : topo.ranks_per_node);
  p.nodes = std::max(p.nodes, n / std::max(1, topo.ranks_per_node));
  p.fast_domain_nodes = std::max(p.fast_domain_nodes, p.nodes);
}

}  // namespace

void run_calibrate(const CalibrateOptions& o) {
  comm::Group world = comm::Group::world();
  const int n = world.size(), me = world.rank();
  const bool root = me == 0;
  kernels::set_blas_threads(o.threads);
  const std::function<void(const std::string&)> say = [&](const std::string& s) {
    if (root && o.verbose) std::fprintf(stderr, "calibrate: %s\n", s.c_str());
  };

  // Setup errors are found on rank 0 and shared, so every rank stops together.
  plan::ClusterProfile p;
  std::string error;
  if (root) {
    try {
      // A new or regular file (io/output_file.h), before minutes of measuring; --append reads
      // and rewrites the same profile on purpose.
      io::check_output_path(o.out, "calibrate --out");
      if (o.append) {
        MOE_CHECK(std::filesystem::exists(o.out), o.out,
                  ": --append needs an existing profile (run `moetrain calibrate -o ", o.out, "` first)");
        p = plan::load_profile(o.out);
        MOE_CHECK(p.kind == NodeKind::kCpu, o.out, ": --append extends a profile written by moetrain calibrate (kind cpu), this one is kind ", p.kind);
      }
      MOE_CHECK(o.ranks_per_node >= 0 && o.nodes_per_group >= 0, "--ranks-per-node / --nodes-per-group must be >= 0");
    } catch (const Error& e) {
      error = e.what();
    }
  }
  int64_t bad = error.empty() ? 0 : 1;
  if (n > 1) world.allreduce_max(&bad, 1);
  if (bad) throw Error(root ? error : "calibration setup failed on rank 0");
  const comm::Topology topo = comm::Topology::detect(n, o.ranks_per_node, o.nodes_per_group);

  if (!o.append) {
    if (root) calibrate_compute(p, o, say);
    if (n > 1) comm::quiet_barrier();
  }
  if (n > 1) calibrate_sharing(p, o, world, say);
  if (n > 1) calibrate_comm(p, o, world, topo, say);
  if (root) {
    p.validate(o.out);
    plan::save_profile(p, o.out, "calibrate --out");
    say(str_cat("wrote ", o.out, " (", n, " rank(s); sgemm peak ", p.peak_flops * 1e-9,
                " GFLOP/s per rank, memory-bound ", p.elem_fwd.y.back() * 1e9, " / ", p.elem_bwd.y.back() * 1e9,
                " ns per element fwd / bwd (+ ", p.recompute_fwd.y.back() * 1e9, " / ",
                p.recompute_bwd.y.back() * 1e9, " recomputed) at ", p.elem_fwd.x.back() / 1e6,
                " MB activations, optimizer ", p.optimizer_s_per_param * 1e9, " ns per parameter)"));
  }
}

}  // namespace moe::train
