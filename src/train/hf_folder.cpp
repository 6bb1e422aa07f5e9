#include "train/hf_folder.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "model/weights_io.h"
#include "train/checkpoint_manifest.h"  // is_plain_shard_name

namespace moe::train {

namespace {

// IEEE binary16 -> binary32 (subnormals, Inf and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal: man · 2^-24
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const uint32_t bits = exp == 0x1f ? sign | 0x7f800000u | (man << 13)            // Inf / NaN
                                    : sign | ((exp + 112u) << 23) | (man << 13);  // 127 - 15 = 112
  std::memcpy(&f, &bits, 4);
  return f;
}

// n elements of `dtype` at src (any alignment: copied out, never dereferenced in place) -> dst.
void widen(const uint8_t* src, const std::string& dtype, size_t n, float* dst) {
  if (dtype == "F32") {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    if (dtype == "BF16") {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;  // bf16 is fp32's upper half
      std::memcpy(dst + i, &bits, 4);
    } else {
      dst[i] = half_to_float(h);
    }
  }
}

bool is_weight_dtype(const std::string& d) { return d == "F32" || d == "BF16" || d == "F16"; }

bool has_entry(const std::string& p) { return io::entry_exists(p); }

}  // namespace

HfFolder HfFolder::open(const std::string& dir) {
  HfFolder f;
  f.dir_ = dir;
  f.config_path_ = dir + "/config.json";
  f.cfg_ = model::load_config(f.config_path_, /*in_folder=*/true);
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (has_entry(index_path)) {
    f.index_path_ = index_path;
    const nlohmann::json index = io::read_json_file(index_path, "safetensors index", /*no_follow=*/true);
    MOE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              index_path, ": no \"weight_map\" object");
    for (const auto& [name, file] : index["weight_map"].items()) {
      MOE_CHECK(file.is_string(), index_path, ": weight_map[", io::quoted(name), "] is not a file name");
      const std::string fname = file.get<std::string>();
      // As a checkpoint's shard names: letters, digits, '.', '_', '-', no "..", ending .safetensors.
      MOE_CHECK(is_plain_shard_name(fname), index_path, ": weight_map[", io::quoted(name), "] = ", io::quoted(fname),
                " is not a plain file name inside the folder (allowed: letters, digits, '.', '_', '-'; no \"..\", "
                "no '/', ending .safetensors)");
      f.name_to_file_[name] = fname;
    }
  } else {
    MOE_CHECK(has_entry(dir + "/model.safetensors"), dir,
              ": neither model.safetensors nor model.safetensors.index.json is there");
  }
  std::vector<std::string> names;
  if (f.index_path_.empty()) names.push_back("model.safetensors");
  for (const auto& [tensor, file] : f.name_to_file_) names.push_back(file);
  for (const std::string& name : names) {
    if (f.files_.count(name)) continue;
    const io::DataFile df = io::open_in_folder(dir, name, "weight file", "a model folder");
    f.files_.emplace(name, io::SafetensorsFile::from_fd(df.fd(), dir + "/" + name));
  }
  if (f.index_path_.empty())
    for (const io::TensorInfo& t : f.files_.at("model.safetensors").tensors())
      f.name_to_file_[t.name] = "model.safetensors";
  return f;
}

const io::SafetensorsFile* HfFolder::file_of(const std::string& tensor) const {
  auto it = name_to_file_.find(tensor);
  if (it == name_to_file_.end()) return nullptr;
  const io::SafetensorsFile& f = files_.at(it->second);
  return f.has(tensor) ? &f : nullptr;
}

std::string HfFolder::where(const std::string& tensor) const {
  auto it = name_to_file_.find(tensor);
  if (it != name_to_file_.end()) return files_.at(it->second).path();
  return index_path_.empty() ? dir_ + "/model.safetensors" : index_path_;
}

void HfFolder::check(const model::ParamLayout& full) const {
  const model::ModelConfig& c = cfg_;
  auto is_bias = [&](const std::string& name, int64_t* E) {
    if (!c.aux_free_balancing()) return false;
    for (int l = 0; l < c.num_hidden_layers; ++l)
      if (c.is_moe_layer(l) && name == model::score_bias_name(l)) {
        *E = c.n_routed_experts;
        return true;
      }
    return false;
  };
  for (const model::ParamSpec& s : full.specs()) {
    const io::SafetensorsFile* f = file_of(s.name);
    MOE_CHECK(f, where(s.name), ": tensor \"", s.name, "\" is missing");
    const io::TensorInfo& t = f->info(s.name);
    MOE_CHECK(is_weight_dtype(t.dtype), f->path(), ": tensor \"", s.name, "\" has dtype ", t.dtype, ", expected ",
              kHfWeightDtypes);
    MOE_CHECK(t.shape == s.full_shape, f->path(), ": tensor \"", s.name, "\" has shape ", io::shape_str(t.shape),
              ", expected ", io::shape_str(s.full_shape));
  }
  // DeepSeek-V3's checkpoint repeats the embedding and the head in its MTP layer L
  // (model.layers.L.embed_tokens / shared_head.head); moetrain ties them to the main model's, so
  // these copies are accepted (checked, [V, H]) and not read.
  auto is_mtp_copy = [&](const std::string& name) {
    if (c.num_nextn_predict_layers == 0) return false;
    const std::string p = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    return name == p + "embed_tokens.weight" || name == p + "shared_head.head.weight";
  };
  // Every tensor of every file, and every name the index lists: a parameter, a noaux bias, or
  // one of V3's MTP copies.
  auto check_extra = [&](const std::string& name, const std::string& in) {
    int64_t E = 0;
    if (full.contains(name)) return;
    const bool copy = is_mtp_copy(name);
    MOE_CHECK(copy || is_bias(name, &E), in, ": unexpected tensor ", io::quoted(name),
              " (not a parameter of this config)");
    const std::vector<int64_t> shape = copy ? std::vector<int64_t>{c.vocab_size, c.hidden_size} : std::vector<int64_t>{E};
    const io::SafetensorsFile* f = file_of(name);
    MOE_CHECK(f, where(name), ": tensor \"", name, "\" is missing");
    const io::TensorInfo& t = f->info(name);
    MOE_CHECK(is_weight_dtype(t.dtype), f->path(), ": tensor \"", name, "\" has dtype ", t.dtype, ", expected ",
              kHfWeightDtypes);
    MOE_CHECK(t.shape == shape, f->path(), ": tensor \"", name, "\" has shape ", io::shape_str(t.shape),
              ", expected ", io::shape_str(shape));
  };
  for (const auto& [name, file] : name_to_file_) check_extra(name, where(name));
  for (const auto& [fname, f] : files_)
    for (const io::TensorInfo& t : f.tensors()) {
      check_extra(t.name, f.path());
      // A shard holding a tensor the index puts in another file: which copy counts is unclear.
      auto it = name_to_file_.find(t.name);
      MOE_CHECK(it != name_to_file_.end() && it->second == fname, f.path(), ": tensor ", io::quoted(t.name),
                " is not listed for this file in ", index_path_);
    }
}

void HfFolder::read(const model::ParamLayout& local, float* params) const {
  const model::TpShard& tp = local.tp();
  for (const model::ParamSpec& s : local.specs()) {
    const io::SafetensorsFile* f = file_of(s.name);
    MOE_CHECK(f, where(s.name), ": tensor \"", s.name, "\" is missing");
    const io::TensorInfo& t = f->info(s.name);
    MOE_CHECK(is_weight_dtype(t.dtype) && t.shape == s.full_shape, f->path(), ": tensor \"", s.name,
              "\" has dtype ", t.dtype, " and shape ", io::shape_str(t.shape), ", expected ", kHfWeightDtypes, " ",
              io::shape_str(s.full_shape));
    const auto* src = static_cast<const uint8_t*>(f->data(s.name));
    const size_t esize = io::dtype_size(t.dtype);
    float* dst = params + s.offset;
    if (s.tp_dim < 0) {
      widen(src, t.dtype, s.numel, dst);
    } else if (s.tp_dim == 0) {  // rows [rank·R/tp, (rank+1)·R/tp) of [R, C]: one block
      widen(src + tp.rank * s.numel * esize, t.dtype, s.numel, dst);
    } else {  // columns [rank·C/tp, ...) of each row of [R, C]
      const size_t R = static_cast<size_t>(s.shape[0]), Cl = static_cast<size_t>(s.shape[1]);
      const size_t C = static_cast<size_t>(s.full_shape[1]);
      for (size_t r = 0; r < R; ++r) widen(src + (r * C + tp.rank * Cl) * esize, t.dtype, Cl, dst + r * Cl);
    }
    for (size_t i = 0; i < s.numel; ++i)
      MOE_CHECK(std::isfinite(dst[i]), f->path(), ": tensor \"", s.name, "\" holds ", dst[i],
                " at element ", i, " of this rank's part: refusing non-finite values");
  }
}

nlohmann::json HfFolder::score_bias_json() const {
  if (!cfg_.aux_free_balancing()) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    if (!cfg_.is_moe_layer(l)) continue;
    const std::string name = model::score_bias_name(l);
    const io::SafetensorsFile* f = file_of(name);
    if (!f) continue;
    const io::TensorInfo& t = f->info(name);
    MOE_CHECK(is_weight_dtype(t.dtype) && t.shape == std::vector<int64_t>{cfg_.n_routed_experts}, f->path(),
              ": tensor \"", name, "\" has dtype ", t.dtype, " and shape ", io::shape_str(t.shape), ", expected ",
              kHfWeightDtypes, " [", cfg_.n_routed_experts, "]");
    std::vector<float> bias(cfg_.n_routed_experts);
    widen(static_cast<const uint8_t*>(f->data(name)), t.dtype, bias.size(), bias.data());
    j[std::to_string(l)] = bias;
  }
  return j.empty() ? nlohmann::json(nullptr) : j;
}

}  // namespace moe::train
