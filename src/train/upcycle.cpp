#include "train/upcycle.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "train/hf_folder.h"
#include "train/run_guard.h"
#include "train/staged_folder.h"

namespace moe::train {
namespace fs = std::filesystem;

namespace {

// "zero" -> 0; else a finite standard deviation in [0, 1].
double router_std(const std::string& text) {
  if (text == "zero") return 0.0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  MOE_CHECK(!text.empty() && end && *end == '\0' && std::isfinite(v) && v >= 0 && v <= 1, "--router-init: expected ",
            "zero or a standard deviation in [0, 1] (e.g. 0.02), got '", text, "'");
  return v;
}

double rms(const float* w, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(w[i]) * w[i];
  return n ? std::sqrt(s / n) : 0.0;
}

}  // namespace

model::ModelConfig upcycled_config(const model::ModelConfig& dense, const UpcycleOptions& o) {
  MOE_CHECK(dense.n_routed_experts == 0, "upcycle: the input model already has n_routed_experts = ",
            dense.n_routed_experts, " (upcycling starts from a dense model)");
  MOE_CHECK(o.experts >= 1 && o.experts <= 4096, "--experts must be in [1, 4096], got ", o.experts);
  MOE_CHECK(o.topk >= 1 && o.topk <= o.experts, "--topk must be in [1, --experts ", o.experts, "], got ", o.topk);
  MOE_CHECK(o.split >= 1 && o.split <= dense.intermediate_size, "--split must be in [1, intermediate_size ",
            dense.intermediate_size, "], got ", o.split);
  MOE_CHECK(dense.intermediate_size % o.split == 0, "--split ", o.split, " does not divide the dense model's ",
            "intermediate_size ", dense.intermediate_size, " (each expert takes intermediate_size / split columns)");
  MOE_CHECK(o.shared >= 0 && o.shared <= 64, "--shared must be in [0, 64], got ", o.shared);
  MOE_CHECK(std::isfinite(o.noise) && o.noise >= 0 && o.noise <= 1, "--noise must be a finite number in [0, 1] ",
            "(relative to each weight matrix's RMS), got ", o.noise);
  router_std(o.router_init);
  MOE_CHECK(o.first_dense >= -1, "--first-dense must be >= 0 (the layers [0, N) that stay dense), got ", o.first_dense);
  const int first = o.first_dense < 0 ? dense.first_k_dense_replace : o.first_dense;
  MOE_CHECK(first < dense.num_hidden_layers, "--first-dense ", first, " leaves no layer to upcycle (the model has ",
            dense.num_hidden_layers, " layers)");
  model::ModelConfig c = dense;
  c.n_routed_experts = o.experts * o.split;
  c.num_experts_per_tok = o.topk * o.split;
  c.moe_intermediate_size = dense.intermediate_size / o.split;
  c.n_shared_experts = o.shared;
  c.first_k_dense_replace = first;
  c.moe_layer_freq = 1;
  c.norm_topk_prob = true;
  c.scoring_func = "softmax";
  c.topk_method = "greedy";
  c.n_group = c.topk_group = 1;
  c.routed_scaling_factor = 1.0f;
  c.aux_loss_alpha = o.aux_loss_alpha;
  c.seq_aux = false;
  c.validate("upcycled config");
  return c;
}

UpcycleResult upcycle(const UpcycleOptions& o) {
  std::error_code ec;
  MOE_CHECK(fs::is_directory(o.dense_dir, ec), o.dense_dir, ": no such folder (expected a dense model's Hugging ",
            "Face folder, e.g. from `moetrain export`)");
  MOE_CHECK(!o.out_dir.empty(), "upcycle: -o OUT is required");
  MOE_CHECK(!fs::equivalent(o.out_dir, o.dense_dir, ec), "-o ", o.out_dir, ": is the folder it reads; the ",
            "upcycled model never overwrites its input");
  const HfFolder hf = HfFolder::open(o.dense_dir);
  const model::ModelConfig& dense = hf.config();
  dense.validate(hf.config_path());
  UpcycleResult res;
  res.config = upcycled_config(dense, o);
  const model::ModelConfig& c = res.config;
  const model::ParamLayout dl(dense), ml(c);
  hf.check(dl);
  check_output_dir(o.out_dir, "-o");
  DirLock lock = DirLock::acquire(o.out_dir, "-o", str_cat("moetrain upcycle ", o.dense_dir, " -o ", o.out_dir));
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    io::check_output_path(o.out_dir + "/" + f, "-o", {o.dense_dir});
  std::vector<float> d(dl.total()), m(ml.total());
  hf.read(dl, d.data());

  for (const model::ParamSpec& s : ml.specs())  // attention, norms, embedding, head, dense layers
    if (dl.contains(s.name)) std::memcpy(m.data() + s.offset, d.data() + dl.find(s.name).offset, s.numel * sizeof(float));
  Rng rng(o.seed);
  const double r_std = router_std(o.router_init);
  const int64_t H = c.hidden_size, I = dense.intermediate_size, F = c.moe_intermediate_size;
  const int S = o.split;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    ++res.moe_layers;
    const std::string p = str_cat("model.layers.", l, ".mlp.");
    const float* gate = d.data() + dl.find(p + "gate_proj.weight").offset;  // [I, H]
    const float* up = d.data() + dl.find(p + "up_proj.weight").offset;      // [I, H]
    const float* down = d.data() + dl.find(p + "down_proj.weight").offset;  // [H, I]
    const double n_gate = o.noise * rms(gate, I * H), n_up = o.noise * rms(up, I * H),
                 n_down = o.noise * rms(down, H * I);
    float* router = m.data() + ml.find(p + "gate.weight").offset;  // [E·S, H]
    for (int64_t i = 0; i < c.n_routed_experts * H; ++i) router[i] = static_cast<float>(r_std * rng.normal());
    // Rows [s·F, (s+1)·F) of gate / up, columns of down times `scale`, each element plus noise.
    auto slice = [&](int s, float* eg, float* eu, float* ed, float scale, bool noisy) {
      for (int64_t f = 0; f < F; ++f)
        for (int64_t h = 0; h < H; ++h) {
          eg[f * H + h] = static_cast<float>(gate[(s * F + f) * H + h] + (noisy ? n_gate * rng.normal() : 0.0));
          eu[f * H + h] = static_cast<float>(up[(s * F + f) * H + h] + (noisy ? n_up * rng.normal() : 0.0));
        }
      for (int64_t h = 0; h < H; ++h)
        for (int64_t f = 0; f < F; ++f)
          ed[h * F + f] =
              static_cast<float>(scale * (down[h * I + s * F + f] + (noisy ? n_down * rng.normal() : 0.0)));
    };
    for (int e = 0; e < c.n_routed_experts; ++e) {
      const std::string q = str_cat(p, "experts.", e, ".");
      slice(e % S, m.data() + ml.find(q + "gate_proj.weight").offset, m.data() + ml.find(q + "up_proj.weight").offset,
            m.data() + ml.find(q + "down_proj.weight").offset, static_cast<float>(S), o.noise > 0);
    }
    if (c.n_shared_experts > 0) {
      // Shared expert j: slice j mod S of the dense MLP, unscaled; stacked as one [N·F, H] MLP.
      float* sg = m.data() + ml.find(p + "shared_experts.gate_proj.weight").offset;  // [N·F, H]
      float* su = m.data() + ml.find(p + "shared_experts.up_proj.weight").offset;    // [N·F, H]
      float* sd = m.data() + ml.find(p + "shared_experts.down_proj.weight").offset;  // [H, N·F]
      const int64_t NF = F * c.n_shared_experts;
      std::vector<float> g(F * H), u(F * H), dn(H * F);
      for (int j = 0; j < c.n_shared_experts; ++j) {
        slice(j % S, g.data(), u.data(), dn.data(), 1.0f, false);
        std::memcpy(sg + j * F * H, g.data(), g.size() * sizeof(float));
        std::memcpy(su + j * F * H, u.data(), u.size() * sizeof(float));
        for (int64_t h = 0; h < H; ++h) std::memcpy(sd + h * NF + j * F, dn.data() + h * F, F * sizeof(float));
      }
    }
  }

  // Written as `moetrain export` writes (train/export.cpp): a staging folder that replaces OUT whole.
  static const std::regex earlier(R"(config\.json|model(-[0-9]+-of-[0-9]+)?\.safetensors|model\.safetensors\.index\.json(\.tmp.*)?)");
  StagedFolder staged(o.out_dir, "-o");
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const model::ParamSpec& s : ml.specs()) w.add_f32(s.name, s.shape, m.data() + s.offset);
  w.write(staged.path() + "/model.safetensors", "-o");
  model::save_config(c, staged.path() + "/config.json");
  staged.publish(earlier);
  return res;
}

}  // namespace moe::train
