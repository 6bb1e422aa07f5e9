#include "train/run_setup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "io/data_file.h"
#include "io/dataset.h"
#include "io/indexed_dataset.h"
#include "io/output_file.h"
#include "io/token_corpus.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/peak_rate.h"
#include "parallel/parallel_dims.h"
#include "plan/cluster.h"
#include "plan/time_model.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/init_from.h"
#include "train/run_memory.h"
#include "train/score_bias.h"

namespace moe::train {
namespace fs = std::filesystem;
using nlohmann::json;

void agree(const comm::Group& world, const std::string& error) {
  if (world.size() > 1) {
    int64_t flag = error.empty() ? 0 : world.size() - world.rank();
    world.allreduce_max(&flag, 1);
    if (flag > 0) {
      const int reporter = world.size() - static_cast<int>(flag);
      throw SetupError(error.empty() ? "another rank failed during setup" : error, world.rank() == reporter);
    }
  } else if (!error.empty()) {
    throw SetupError(error, true);
  }
}

namespace {

// --precision auto (see kAutoBf16MinGain): both peaks measured on each rank of a CPU run, and bf16
// only where every rank gains enough, so the replicas never train in different precisions.
void resolve_auto_precision(RunSetup& r, const TrainOptions& opts) {
  int64_t fp32_somewhere = 1;
  if (r.device == Device::kCpu && kernels::bf16_cpu_available()) {
    kernels::set_blas_threads(opts.device.threads);  // the trainer's count: its peak is this one
    r.auto_fp32_peak = kernels::measure_peak_gflops(Precision::kFp32);
    r.auto_bf16_peak = kernels::measure_peak_gflops(Precision::kBf16);
    fp32_somewhere = r.auto_bf16_peak >= kAutoBf16MinGain * r.auto_fp32_peak ? 0 : 1;
  }
  if (r.world.size() > 1) r.world.allreduce_max(&fp32_somewhere, 1);
  r.precision = fp32_somewhere == 0 ? Precision::kBf16 : Precision::kFp32;
}

// --a2a auto: of the four exchanges, the one the planner's cost model (plan/time_model.h, the
// figures `moetrain plan` charges) prices lowest for one MoE layer's micro-batch of this run:
// dispatch and combine forward, their adjoints backward, and the plan; on --cluster's profile (its
// measured curves where `moetrain calibrate` wrote them for this world and group, else its link
// model), with the run's own topology. Returns the choice and the header's reason.
std::pair<A2a, std::string> choose_a2a(const TrainOptions& opts, const model::ModelConfig& cfg,
                                       const comm::Topology& topo, int world) {
  const parallel::ParallelDims& d = opts.parallel.dims;
  plan::ClusterProfile c = plan::resolve_cluster(opts.parallel.a2a_cluster);  // a bad profile is an error anyway
  if (d.ep < 2 || cfg.num_moe_layers() == 0)
    return {A2a::kFlat, "flat: no token exchange in this layout"};
  c.ranks_per_node = topo.ranks_per_node;  // the run's own nodes, whatever the profile was made on
  const double tokens = static_cast<double>(opts.data.batch) / opts.parallel.micro_batches * opts.data.seq_len / d.tp;
  const double pairs = tokens * cfg.num_experts_per_tok;
  const double bytes = pairs * cfg.hidden_size * sizeof(float);
  const bool measured = c.find_comm("a2a", A2a::kFlat, world, d.ep, std::min(world, c.ranks_per_node)) != nullptr;
  std::string why;
  A2a best = A2a::kFlat;
  double best_s = INFINITY;
  for (A2a a : {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo}) {
    const double s = 4 * plan::a2a_seconds(c, a, world, d.ep, d.tp, bytes, cfg.num_experts_per_tok, pairs) +
                     plan::a2a_plan_seconds(c, a, world, d.ep, d.tp, pairs);
    MOE_CHECK(std::isfinite(s) && s >= 0, "--a2a auto: the profile ", c.name, " prices ", a, " at ", s,
              " s; is it a calibrated profile?");
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.3g ms", s * 1e3);
    why += str_cat(why.empty() ? "" : ", ", a, " ", ms);
    if (s < best_s * (1 - 1e-9)) best_s = s, best = a;  // a tie keeps the simpler exchange
  }
  return {best, str_cat(name(best), ": the planner prices one MoE layer's micro-batch (",
                        static_cast<long long>(tokens), " tokens x k ", cfg.num_experts_per_tok, ", H ", cfg.hidden_size,
                        ") at ", why, " on ", topo.describe(), " with ", c.name,
                        measured ? " (its measured all-to-all curves)" : " (its link model)")};
}

// The steps of setup_run, in the order they must run: each throws the error the user sees.

// The options' enumerated values parsed, the model config loaded (--preset / --config,
// --vocab-size) and checked against the device, the data (indexed: an indexed dataset), the
// layout and the balancing flags; --a2a auto decided.
void check_options_and_model(const TrainOptions& opts, RunSetup& r, bool indexed) {
  model::ModelConfig& cfg = r.cfg;
  const int world_size = r.world.size();
  validate_options(opts);
  const bool a2a_auto = !opts.parallel.a2a.has_value();
  MOE_CHECK(opts.parallel.a2a_cluster.empty() || a2a_auto, "--cluster ", opts.parallel.a2a_cluster,
            " is the profile --a2a auto prices the exchanges with; with --a2a ", name_or_auto(opts.parallel.a2a),
            " nothing reads it");
  MOE_CHECK(!a2a_auto || !opts.parallel.a2a_cluster.empty(),
            "--a2a auto needs --cluster PROFILE (a `moetrain calibrate` file measured on these nodes, or a preset) "
            "to price the exchanges with");
  if (!a2a_auto) r.a2a = *opts.parallel.a2a;
  r.comm_backend = opts.device.comm_backend;
  r.schedule = opts.parallel.schedule;
  r.recompute = opts.model.recompute;
  r.precision = opts.device.precision.value_or(Precision::kFp32);  // auto: resolved after the checks
  const comm::Topology topo =
      comm::Topology::detect(world_size, opts.parallel.topo_ranks_per_node, opts.parallel.topo_nodes_per_group);
  // The device: usable here (a CUDA build and a GPU), and a layout the GPU path has.
  r.device = opts.device.type;
  const Device device = r.device;
  require_device(device, "--device");
  MOE_CHECK(device == Device::kCpu || !opts.model.moe.padded,
            "--padded: the capacity-padded baseline runs on the CPU only (--device cpu)");
  cfg = !opts.model.init_from.empty()    ? init_from_config(opts.model)  // train/init_from.h
        : opts.model.config_path.empty() ? model::preset(opts.model.preset)
                                         : model::load_config(opts.model.config_path);
  MOE_CHECK(opts.data.seq_len <= cfg.max_position_embeddings, "--seq-len ", opts.data.seq_len,
            " exceeds the model's max_position_embeddings ", cfg.max_position_embeddings);
  // --vocab-size: a tokenized dataset's
  if (opts.model.vocab_size > 0) cfg.vocab_size = opts.model.vocab_size;
  static_cast<void>(ScoreBias(cfg, opts.balance.bias_rate));  // --balance.bias-rate against the model, before any output
  // Byte-level text needs the 256 byte ids; an indexed dataset's ids are checked when it loads.
  MOE_CHECK(indexed || cfg.vocab_size >= 256, "byte-level data needs vocab_size >= 256, the config has ",
            cfg.vocab_size);
  opts.parallel.dims.validate(world_size, cfg);
  if (opts.parallel.dims.tp > 1) {
    // Each TP rank takes n = batch·seq_len/tp rows of every micro-batch (model.h: TensorParallel).
    MOE_CHECK(opts.data.seq_len % opts.parallel.dims.tp == 0, "--tp ", opts.parallel.dims.tp, " does not divide --seq-len ",
              opts.data.seq_len);
    MOE_CHECK(!(cfg.seq_aux && cfg.aux_loss_alpha > 0 && cfg.num_moe_layers() > 0) ||
                  (opts.data.batch / opts.parallel.micro_batches) % opts.parallel.dims.tp == 0,
              "--tp ", opts.parallel.dims.tp, " with seq_aux: the micro-batch of ", opts.data.batch / opts.parallel.micro_batches,
              " sequences per rank must split into whole sequences per TP rank");
    MOE_CHECK(opts.balance.migrate_every == 0, "--balance.migrate-every with --tp ", opts.parallel.dims.tp,
              ": expert migration under tensor parallelism is not supported yet; use --tp 1");
  }
  MOE_CHECK(opts.balance.migrate_every == 0 || opts.parallel.dims.ep > 1, "--balance.migrate-every ", opts.balance.migrate_every,
            " needs expert parallelism (--ep > 1): with --ep ", opts.parallel.dims.ep, " every expert is on every rank");
  parallel::split_layers(cfg, opts.parallel.dims.pp, opts.parallel.pp_layers);
  if (a2a_auto) std::tie(r.a2a, r.a2a_auto_why) = choose_a2a(opts, cfg, topo, world_size);
}

// The training data: present, regular files, the whole run's memory fitting every rank of this
// host (and its GPU) before anything of that size is allocated; then the corpus opened, its
// tokenizer's identity in the config, and both splits holding a window.
void check_data_and_memory(const TrainOptions& opts, RunSetup& r, const std::string& data_path, bool indexed) {
  const comm::Group& world = r.world;
  const model::ModelConfig& cfg = r.cfg;
  const std::vector<double>& host_of = r.host_of;
  const Device device = r.device;
  if (opts.data.path.empty() && !fs::exists(data_path))
    throw Error(str_cat(data_path, ": built-in corpus not found; run scripts/setup.sh first"));
  // A FIFO would block the open, a device never ends: only a regular file, checked by stat.
  if (indexed) {
    check_regular_input(io::idx_path(io::indexed_prefix(data_path)), "--data");
    check_regular_input(io::bin_path(io::indexed_prefix(data_path)), "--data");
  } else {
    check_regular_input(data_path, "--data");
  }
  {
    // Memory: every rank on this host, before anything of that size is allocated.
    const double corpus_bytes = io::corpus_resident_bytes(data_path);  // mmapped data: its tables only
    const std::vector<RankMemory> need = estimate_run_memory(cfg, opts, world.size(), corpus_bytes);
    std::vector<int> here;
    for (int r = 0; r < world.size(); ++r)
      if (host_of[r] == host_of[world.rank()]) here.push_back(r);
    check_memory_fits(need, here, available_memory(), opts);
    if (device == Device::kCuda) {
      // The model's state and activations live on the GPU: they must fit in what it has free.
      size_t free_b = 0, total_b = 0;
      cuda_mem_info(&free_b, &total_b);
      const double gpu_need = need[world.rank()].state + need[world.rank()].activations;
      MOE_CHECK(gpu_need <= static_cast<double>(free_b), "not enough GPU memory: this run needs ",
                format_bytes(gpu_need), " (", static_cast<uint64_t>(gpu_need), " bytes: ",
                format_bytes(need[world.rank()].state), " weights, gradients and AdamW state, ",
                format_bytes(need[world.rank()].activations), " activations and workspace) on the GPU, ",
                format_bytes(static_cast<double>(free_b)), " (", free_b, " bytes) free of ",
                format_bytes(static_cast<double>(total_b)), "; use a smaller --batch or --seq-len, ",
                "more --micro-batches or --recompute");
    }
  }
  r.corpus = io::open_corpus(data_path, cfg.vocab_size);
  io::Corpus* corpus = r.corpus.get();
  // The model learns this tokenizer's ids: its identity goes into every checkpoint and export
  // with the config (io/token_corpus.h), whatever a --config said.
  if (!opts.model.init_from.empty()) {  // the folder's model was trained on the data's tokenizer
    const std::string note = io::check_tokenizer_match(r.cfg.tokenizer_fingerprint, opts.model.init_from + "/config.json",
                                                       corpus->tokenizer_fingerprint(), str_cat("--data ", data_path));
    if (!note.empty() && r.root && opts.progress) std::fprintf(stderr, "moetrain: %s\n", note.c_str());
  }
  r.cfg.tokenizer_fingerprint = corpus->tokenizer_fingerprint();
  // Both splits must hold a window (the checks name the file and the sizes).
  const int n_data = opts.parallel.dims.dp * opts.parallel.dims.ep;
  corpus->val_batches(opts.data.batch * n_data, opts.data.seq_len, 1);
  {
    Rng probe(0);
    std::vector<int32_t> one(static_cast<size_t>(opts.data.seq_len) + 1);
    corpus->sample_batch(one.data(), 1, opts.data.seq_len, probe, io::Split::kTrain);
  }
}

// The root rank's outputs: --out and the checkpoint folder writable now, not after the last
// step, locked for this run, their files new or regular and none of the run's inputs.
void take_output_folders(const TrainOptions& opts, RunSetup& r, const std::string& data_path, bool indexed) {
  const comm::Group& world = r.world;
  const std::string& ckpt_dir = r.ckpt_dir;
  // Outputs: writable now, not after the last step; one run per folder (the lock is held
  // until this process ends; its file names the holder for a second run).
  const std::string what = str_cat("moetrain train --out ", opts.out_dir, " (", world.size(), " rank(s))");
  check_output_dir(opts.out_dir, "--out");
  r.out_lock = DirLock::acquire(opts.out_dir, "--out", what);
  // Its files: new or regular (never a link, FIFO, device or folder), none of the run's
  // inputs (io/output_file.h): --data, --config, the --resume checkpoint.
  std::vector<std::string> inputs = {opts.model.config_path, opts.checkpoint.resume == "latest" ? "" : opts.checkpoint.resume,
                                     opts.model.init_from};
  if (indexed) {
    const std::string prefix = io::indexed_prefix(data_path);
    inputs.insert(inputs.end(), {io::idx_path(prefix), io::bin_path(prefix), io::tokenizer_info_path(prefix)});
  } else {
    inputs.push_back(data_path);
  }
  for (const char* f : {"model.safetensors", "config.json", "metrics.jsonl", "metrics.jsonl.prev"})
    io::check_output_path(opts.out_dir + "/" + f, "--out", inputs);
  check_output_dir(ckpt_dir, opts.checkpoint.dir.empty() ? "--out (its checkpoints folder)" : "--checkpoint.dir");
  std::error_code ec;
  if (!fs::equivalent(ckpt_dir, opts.out_dir, ec))
    r.ckpt_lock = DirLock::acquire(
        ckpt_dir, opts.checkpoint.dir.empty() ? "--out (its checkpoints folder)" : "--checkpoint.dir", what);
  // Both folders are ours now: a temp file whose writer died (kill -9) is swept, and said.
  for (const std::string& d : {opts.out_dir, ckpt_dir})
    for (const std::string& line : sweep_stale_temp_files(d))
      std::fprintf(stderr, "moetrain: %s\n", line.c_str());
}

// --resume: the checkpoint found and verified, written for this model, not past --steps, its
// expert placement usable by this layout, the same tokenizer and (by name) the same data.
void check_resume(const TrainOptions& opts, RunSetup& r, const std::string& data_path) {
  const model::ModelConfig& cfg = r.cfg;
  const bool root = r.root;
  io::Corpus* corpus = r.corpus.get();
  const std::string& ckpt_dir = r.ckpt_dir;
  std::string& resume_path = r.resume_path;
  resume_path = opts.checkpoint.resume == "latest" ? find_latest_checkpoint(ckpt_dir) : opts.checkpoint.resume;
  MOE_CHECK(!resume_path.empty(), ckpt_dir, ": --resume latest found no complete checkpoint");
  CheckpointMeta meta = read_checkpoint_meta(resume_path, /*verify=*/true);
  json want = model::config_to_json(cfg);
  want.erase("moetrain_tokenizer_fingerprint");  // compared below, naming both
  for (const auto& [key, value] : want.items())
    MOE_CHECK(meta.config.contains(key) && meta.config[key] == value, resume_path,
              ": checkpoint was written for a different model (", key, " = ",
              meta.config.contains(key) ? meta.config[key].dump() : "missing", ", this run: ",
              value.dump(), ")");
  MOE_CHECK(meta.step <= opts.steps, resume_path, ": checkpoint is at step ", meta.step,
            ", beyond --steps ", opts.steps);
  static_cast<void>(restored_placement(meta, cfg, opts.parallel.dims.ep, resume_path));  // checked before any output
  // The same tokenizer, and the same data when it has the same name (issue 42, classes 4-5).
  const std::string mpath = resume_path + "/manifest.json";
  const auto had = meta.config.find("moetrain_tokenizer_fingerprint");
  const std::string note = io::check_tokenizer_match(
      had != meta.config.end() && had->is_string() ? had->get<std::string>() : std::string(), mpath,
      cfg.tokenizer_fingerprint, str_cat("--data ", data_path));
  if (!note.empty() && root && opts.progress) std::fprintf(stderr, "moetrain: %s\n", note.c_str());
  const io::Corpus::Identity now = corpus->identity();
  if (meta.data.is_object() && meta.data["file"] == now.file) {
    const uint64_t bytes = meta.data["bytes"].get<uint64_t>();
    const std::string sample = meta.data["sample"].get<std::string>();
    MOE_CHECK(bytes == now.bytes && sample == now.sample, now.file, ": not the data this run trained on: ",
              mpath, " records ", bytes, " bytes with sampled checksum ", sample, ", the file now has ", now.bytes,
              " bytes with ", now.sample, " (replaced or modified since; restore it, or train afresh)");
    // Same size and sampled blocks but touched since: most likely a copy or `touch`, but an
    // edit between the sampled blocks looks the same; said, not refused.
    const auto t = meta.data.find("mtime_ns");
    if (t != meta.data.end() && t->is_number_integer() && t->get<int64_t>() != now.mtime_ns && root &&
        opts.progress)
      std::fprintf(stderr, "moetrain: note: %s was modified since %s was written (its size and sampled blocks "
                           "match)\n",
                   now.file.c_str(), mpath.c_str());
  }
}

// metrics.jsonl, opened by the root rank once every check passed, so a run refused in setup leaves
// an earlier run's file as it was. A resumed run appends to the run it continues; a fresh one
// keeps the earlier file as metrics.jsonl.prev.
void open_metrics(const TrainOptions& opts, RunSetup& r) {
  const std::string metrics_path = opts.out_dir + "/metrics.jsonl";
  std::error_code ec;
  if (opts.checkpoint.resume.empty() && fs::exists(metrics_path, ec) && fs::file_size(metrics_path, ec) > 0) {
    fs::rename(metrics_path, metrics_path + ".prev", ec);
    MOE_CHECK(!ec, metrics_path, ": cannot keep the earlier run's metrics as ", metrics_path, ".prev (",
              ec.message(), ")");
    if (opts.progress)
      std::fprintf(stderr, "moetrain: %s holds an earlier run's metrics: kept as metrics.jsonl.prev\n",
                   opts.out_dir.c_str());
  }
  // Opened without following a link and without blocking on a FIFO, checked to be a regular file
  // on that descriptor; the stream then reopens that same file through /proc/self/fd (a name
  // swapped in between is never written).
  const bool fresh = opts.checkpoint.resume.empty();
  const int fd = ::open(metrics_path.c_str(),
                        O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (fresh ? O_TRUNC : O_APPEND), 0644);
  if (fd < 0)
    throw Error(str_cat(metrics_path, ": cannot open for writing (", std::strerror(errno),
                        errno == ELOOP ? "; it is a symbolic link, never followed" : "", ")"));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const mode_t mode = st.st_mode;
  if (regular) r.metrics.open(str_cat("/proc/self/fd/", fd), fresh ? std::ios::trunc : std::ios::app);
  ::close(fd);
  MOE_CHECK(regular, metrics_path, ": is not a regular file (it is ", io::file_kind(mode),
            "); metrics are appended only to a plain file");
  MOE_CHECK(r.metrics.good(), metrics_path, ": cannot open for writing");
}

}  // namespace

std::unique_ptr<RunSetup> setup_run(const TrainOptions& opts) {
  // Setup: everything that bad input can break, checked on every rank, then agreed on. Nothing
  // large is allocated and no output is touched before the memory estimate and the folder locks.
  auto run = std::make_unique<RunSetup>();
  RunSetup& r = *run;
  r.world = comm::Group::world();
  const comm::Group& world = r.world;
  if (world.size() > 1 && std::isfinite(opts.faults.comm_timeout_s) && opts.faults.comm_timeout_s > 0 &&
      opts.faults.comm_timeout_s < 1e9)
    r.comm_timeout.emplace(opts.faults.comm_timeout_s, &g_stop_requested);
  // Which ranks share this host (their memory adds up): a hash of each rank's host name.
  r.host_of.assign(world.size(), 0.0);
  {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const double mine = static_cast<double>(std::hash<std::string>{}(host) >> 12);  // exact in a double
    if (world.size() > 1)
      world.allgather(&mine, r.host_of.data(), 1);
    else
      r.host_of[0] = mine;
  }
  r.root = world.rank() == 0;
  std::string setup_error;
  try {
    const std::string data_path = opts.data.path.empty() ? default_corpus_path() : opts.data.path;
    const bool indexed = io::is_indexed_dataset(data_path);
    check_options_and_model(opts, r, indexed);
    check_data_and_memory(opts, r, data_path, indexed);
    r.ckpt_dir = opts.checkpoint.dir.empty() ? opts.out_dir + "/checkpoints" : opts.checkpoint.dir;
    if (r.root) take_output_folders(opts, r, data_path, indexed);
    if (!opts.checkpoint.resume.empty()) check_resume(opts, r, data_path);
  } catch (const std::bad_alloc&) {
    setup_error = "out of memory during setup (std::bad_alloc): the memory estimate fitted, the machine did not";
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  agree(world, setup_error);
  if (!opts.device.precision) resolve_auto_precision(r, opts);
  if (r.root) {
    try {
      open_metrics(opts, r);
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  agree(world, setup_error);
  return run;
}

}  // namespace moe::train
