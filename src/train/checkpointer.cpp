#include "train/checkpointer.h"

#include <cstring>

#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/device_select.h"
#include "parallel/parallel_dims.h"
#include "parallel/tensor_parallel.h"
#include "train/score_bias.h"

namespace moe::train {

using nlohmann::json;

namespace {

// The model's parameters and AdamW moments where host code (checkpoint files, weight files) can
// read and write them: the buffers themselves on the CPU, host copies of a GPU's (copy = true
// fills them from the device; to_device() writes them back after a load).
class HostState {
 public:
  // --zero1: m and v are this rank's slices; here they are full logical tensors on the host
  // (copy = true gathers them from every rank: a collective; to_device() keeps this rank's slice).
  HostState(model::Model& model, AdamW& opt, bool copy, const parallel::ZeroShard& shard)
      : device_(model.device()), shard_(&shard) {
    if (shard.sharded()) {
      p_ = model.params();
      if (device_ != Device::kCpu) {
        hp_.resize(model.num_params());
        if (copy) device_copy(Device::kCpu, hp_.data(), device_, model.params(), hp_.size() * sizeof(float));
        p_ = hp_.data();
      }
      for (auto [buf, src] : {std::pair{&hm_, opt.m().data()}, {&hv_, opt.v().data()}}) {
        buf->resize(model.num_params());
        if (copy) shard.gather_full(src, device_, buf->data());
      }
      m_ = hm_.data();
      v_ = hv_.data();
      return;
    }
    if (device_ == Device::kCpu) {
      p_ = model.params();
      m_ = opt.m().data();
      v_ = opt.v().data();
      return;
    }
    for (auto [buf, src] : {std::pair{&hp_, model.params()}, {&hm_, opt.m().data()}, {&hv_, opt.v().data()}}) {
      buf->resize(model.num_params());
      if (copy) device_copy(Device::kCpu, buf->data(), device_, src, buf->size() * sizeof(float));
    }
    p_ = hp_.data();
    m_ = hm_.data();
    v_ = hv_.data();
  }
  float* params() { return p_; }
  float* m() { return m_; }
  float* v() { return v_; }
  void to_device(model::Model& model, AdamW& opt) {
    if (shard_->sharded()) {
      if (device_ != Device::kCpu)
        device_copy(device_, model.params(), Device::kCpu, hp_.data(), hp_.size() * sizeof(float));
      shard_->take_slice(hm_.data(), opt.m().data(), device_);
      shard_->take_slice(hv_.data(), opt.v().data(), device_);
      return;
    }
    if (device_ == Device::kCpu) return;
    for (auto [dst, src] : {std::pair{model.params(), &hp_}, {opt.m().data(), &hm_}, {opt.v().data(), &hv_}})
      device_copy(device_, dst, Device::kCpu, src->data(), src->size() * sizeof(float));
  }

 private:
  Device device_;
  const parallel::ZeroShard* shard_;
  std::vector<float> hp_, hm_, hv_;
  float* p_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
};

// The parameters alone, read-only, on the host (see HostState).
class HostParams {
 public:
  explicit HostParams(const model::Model& model) : n_(model.num_params()) {
    if (model.device() == Device::kCpu) {
      p_ = model.params();
      return;
    }
    host_.resize(n_);
    device_copy(Device::kCpu, host_.data(), model.device(), model.params(), n_ * sizeof(float));
    p_ = host_.data();
  }
  const float* params() const { return p_; }
  size_t num_params() const { return n_; }

 private:
  size_t n_;
  std::vector<float> host_;
  const float* p_ = nullptr;
};


}  // namespace

Checkpointer::Checkpointer(const parallel::Grid& grid, const model::ModelConfig& cfg, std::string dir, int keep,
                           json parallel_json)
    : grid_(grid), cfg_(cfg), dir_(std::move(dir)), keep_(keep), parallel_json_(std::move(parallel_json)) {}

bool Checkpointer::owned(const model::ParamSpec& s) const {
  const parallel::RankCoords& me = grid_.me;
  return me.dp == 0 && me.tp == 0 && (me.ep == 0 || s.is_expert) && !s.tied_copy;
}

CheckpointMeta Checkpointer::resume(const std::string& path, model::Model& model, AdamW& opt,
                                    const parallel::ZeroShard& shard) {
  CheckpointMeta meta = read_checkpoint_meta(path, /*verify=*/false);  // verified in the run's setup
  // The experts' places first: the tensors are loaded by name into them.
  if (std::optional<balance::Placement> p = restored_placement(meta, cfg_, grid_.dims.ep, path))
    model.set_placement(*p);
  HostState h(model, opt, /*copy=*/false, shard);
  if (grid_.dims.tp > 1) {
    // The checkpoint holds logical tensors: each TP rank keeps its slices of them.
    const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg_);
    std::vector<float> p(unsplit.total()), m(unsplit.total()), v(unsplit.total());
    load_checkpoint_tensors(path, unsplit, p.data(), m.data(), v.data());
    for (auto [full, mine] : {std::pair{&p, h.params()}, {&m, h.m()}, {&v, h.v()}})
      parallel::tp_slice(unsplit, full->data(), model.layout(), mine);
  } else {
    load_checkpoint_tensors(path, model.layout(), h.params(), h.m(), h.v());
  }
  h.to_device(model, opt);
  last_ = path;
  return meta;
}

std::string Checkpointer::save(CheckpointMeta meta, model::Model& model, AdamW& opt,
                               const parallel::ZeroShard& shard) {
  meta.config = model::config_to_json(cfg_);
  meta.parallel = parallel_json_;
  meta.expert_placement = model.placement().to_json();
  HostState h(model, opt, /*copy=*/true, shard);
  auto writes = [this](const model::ParamSpec& s) { return this->owned(s); };
  if (grid_.dims.tp > 1) {
    // Logical tensors, whatever the TP degree: the TP group gathers its slices (owned() keeps the
    // writing to its first rank).
    const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg_);
    std::vector<float> p(unsplit.total()), m(unsplit.total()), v(unsplit.total());
    for (auto [mine, full] : {std::pair{h.params(), &p}, {h.m(), &m}, {h.v(), &v}})
      parallel::tp_gather(model.layout(), mine, unsplit, full->data(), grid_.tp);
    last_ = save_checkpoint(grid_.world, dir_, keep_, meta, {&unsplit, p.data(), m.data(), v.data(), writes});
  } else {
    last_ = save_checkpoint(grid_.world, dir_, keep_, meta, {&model.layout(), h.params(), h.m(), h.v(), writes});
  }
  return last_;
}

// Writes every parameter with its Hugging Face name into one file on world rank 0, which gathers
// from the ranks of data-parallel index 0: every stage's tensors, and every EP rank's experts
// (together they hold each parameter exactly once).
void Checkpointer::write_weights(const model::Model& model, const std::vector<int>& layers_per_stage,
                                 const nlohmann::json& router_bias, const std::string& path) const {
  const parallel::Grid& g = grid_;
  const model::ModelConfig& cfg = cfg_;
  if (g.me.dp != 0) return;
  const HostParams m(model);
  // Tensor parallelism: the TP group puts its slices together; its first rank goes on.
  const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg);
  std::vector<float> gathered;
  const float* params = m.params();
  if (g.dims.tp > 1) {
    gathered.resize(unsplit.total());
    parallel::tp_gather(model.layout(), m.params(), unsplit, gathered.data(), g.tp);
    params = gathered.data();
  }
  if (g.me.tp != 0) return;
  // What rank (pp, ep) contributes: everything on ep 0, only its experts on the others.
  auto contributes = [](const model::ParamSpec& s, int ep_rank) { return ep_rank == 0 || s.is_expert; };
  if (g.world.rank() != 0) {
    std::vector<float> mine;
    for (const model::ParamSpec& s : unsplit.specs())
      if (contributes(s, g.me.ep)) mine.insert(mine.end(), params + s.offset, params + s.offset + s.numel);
    g.world.send(mine.data(), static_cast<int64_t>(mine.size()), 0, /*tag=*/71);
    return;
  }
  model::ParamLayout full(cfg);
  std::vector<float> all(full.total());
  for (int pp = 0; pp < g.dims.pp; ++pp) {
    for (int ep = 0; ep < g.dims.ep; ++ep) {
      const int src = parallel::rank_of(g.dims, {pp, 0, ep, 0});
      model::ExpertShard shard = g.dims.ep > 1 ? model::ExpertShard::of(model.placement(), ep) : model::ExpertShard{};
      model::ParamLayout theirs(cfg, shard, parallel::stage_spec(layers_per_stage, pp));
      std::vector<float> buf;
      if (src == 0) {
        buf.assign(params, params + unsplit.total());
      } else {
        size_t n = 0;
        for (const model::ParamSpec& s : theirs.specs()) n += contributes(s, ep) ? s.numel : 0;
        buf.resize(n);
        g.world.recv(buf.data(), static_cast<int64_t>(n), src, /*tag=*/71);
      }
      size_t pos = 0;
      for (const model::ParamSpec& s : theirs.specs()) {
        if (!contributes(s, ep)) continue;
        const size_t from = src == 0 ? s.offset : pos;
        std::memcpy(all.data() + full.find(s.name).offset, buf.data() + from, s.numel * sizeof(float));
        pos += s.numel;
      }
    }
  }
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const model::ParamSpec& s : full.specs()) w.add_f32(s.name, s.shape, all.data() + s.offset);
  ScoreBias bias(cfg, std::nullopt);
  if (bias.active()) {
    bias.load_json(router_bias, "the run's router bias");
    bias.add_tensors(w);
  }
  w.write(path);
}


std::optional<balance::Placement> restored_placement(const CheckpointMeta& meta, const model::ModelConfig& cfg,
                                                     int ep, const std::string& path) {
  const json& p = meta.parallel;
  const bool same_ep = p.is_object() && p.contains("ep") && p["ep"].is_number_integer() && p["ep"] == ep;
  if (ep <= 1 || !same_ep || meta.expert_placement.empty()) return std::nullopt;
  std::vector<bool> is_moe(cfg.num_hidden_layers);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) is_moe[l] = cfg.is_moe_layer(l);
  return balance::Placement::from_json(meta.expert_placement, is_moe, cfg.n_routed_experts, ep,
                                       path + "/manifest.json: field \"expert_placement\"");
}


}  // namespace moe::train
