// `moetrain inspect PATH`. See inspect.h.
#include "report/inspect.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "io/data_file.h"
#include "io/dataset.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "train/checkpoint_manifest.h"
#if __has_include("io/indexed_dataset.h")
#include "io/indexed_dataset.h"
#define MOETRAIN_INSPECT_INDEXED 1
#endif

namespace moe::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string commas(long long v) {  // 1470080 -> "1,470,080"
  std::string s = std::to_string(v < 0 ? -v : v), o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) o += ',';
    o += s[i];
  }
  return v < 0 ? "-" + o : o;
}

std::string mb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MB", bytes / 1e6);
  return b;
}

void line(std::string& out, const std::string& key, const std::string& value) {
  char b[32];
  std::snprintf(b, sizeof b, "%-18s", key.c_str());
  out += b + value + "\n";
}

// The model described by a config: architecture line and parameter counts.
void describe_config(std::string& out, const model::ModelConfig& c) {
  // The other families (model/family.h) place their dense layers anywhere and may group kv heads.
  const std::string dense = c.is_deepseek() ? str_cat(c.first_k_dense_replace, " dense first, ")
                                            : str_cat(c.num_hidden_layers - c.num_moe_layers(), " dense, ");
  const std::string kv = c.kv_heads() == c.num_attention_heads ? "" : str_cat(" (", c.kv_heads(), " kv)");
  line(out, "model",
       str_cat(c.model_type, ": ", c.num_hidden_layers, " layers (", dense, c.num_moe_layers(), " MoE), hidden ",
               c.hidden_size, ", ", c.num_attention_heads, " heads", kv, ", vocab ", c.vocab_size));
  if (c.n_routed_experts > 0)
    line(out, "experts",
         str_cat(c.n_routed_experts, " routed of width ", c.moe_intermediate_size, ", top-", c.num_experts_per_tok,
                 c.norm_topk_prob ? " (renormalised)" : "", ", ", c.n_shared_experts, " shared; aux loss alpha ",
                 c.aux_loss_alpha, c.seq_aux ? " per sequence" : ""));
  line(out, "dense FFN width", std::to_string(c.intermediate_size));
  const model::ParamCounts pc = model::count_params(c);
  line(out, "parameters", str_cat(commas(pc.total), " total, ", commas(pc.active), " active per token"));
}

// One entry per tensor name with the routed experts' index folded: "...experts.*.up_proj.weight".
struct TensorGroup {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<int> experts;  // expert ids folded into this line (empty: a single tensor)
  long long numel = 0;
};

// Names in reading order: runs of digits compare as numbers (layers.2 before layers.10).
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      const std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
      if (x.size() != y.size()) return x.size() < y.size();  // no leading zeros in these names
      if (x != y) return x < y;
      i = i2, j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// "<prefix>.experts.<id>.<rest>" -> prefix ".experts.*." rest and the id, by one linear scan
// (a recursive std::regex overflowed the stack on a 40,000-character name). The last ".experts."
// followed by digits and a '.' counts, as in the greedy pattern it replaces; more than 8 digits or
// none: false.
bool fold_expert(const std::string& name, std::string* key, int* id) {
  static const std::string tag = ".experts.";
  for (size_t at = name.rfind(tag); at != std::string::npos; at = at == 0 ? std::string::npos : name.rfind(tag, at - 1)) {
    const size_t d0 = at + tag.size();
    size_t d1 = d0;
    while (d1 < name.size() && std::isdigit(static_cast<unsigned char>(name[d1]))) ++d1;
    if (d1 == d0 || d1 >= name.size() || name[d1] != '.') continue;
    if (d1 - d0 >= 9) return false;  // an id this long is not an expert index: listed as it is
    *key = name.substr(0, d0) + "*" + name.substr(d1);
    *id = std::stoi(name.substr(d0, d1 - d0));
    return true;
  }
  return false;
}

std::string list_tensors(const std::vector<io::TensorInfo>& ts, long long* total_numel) {
  std::vector<std::string> order;
  std::map<std::string, TensorGroup> groups;
  long long total = 0;
  for (const io::TensorInfo& t : ts) {
    std::string key = t.name;
    int id = -1;
    if (!fold_expert(t.name, &key, &id)) key = t.name;
    // Experts of one layer fold only when dtype and shape agree; otherwise they stay apart.
    const std::string k = str_cat(key, " ", t.dtype, " ", io::shape_str(t.shape));
    auto [it, fresh] = groups.try_emplace(k);
    if (fresh) {
      order.push_back(k);
      it->second.dtype = t.dtype;
      it->second.shape = t.shape;
    }
    if (id >= 0) it->second.experts.push_back(id);
    it->second.numel += t.numel();
    total += t.numel();
  }
  std::sort(order.begin(), order.end(), natural_less);
  std::string out;
  for (const std::string& k : order) {
    const TensorGroup& g = groups[k];
    std::string name = k.substr(0, k.find(' '));
    std::string suffix;
    if (!g.experts.empty()) {
      std::vector<int> e = g.experts;
      std::sort(e.begin(), e.end());
      const bool run = e.back() - e.front() + 1 == static_cast<int>(e.size());
      suffix = run ? str_cat("  x", e.size(), " (experts ", e.front(), "..", e.back(), ")")
                   : str_cat("  x", e.size(), " experts");
    }
    // Name and suffix unbounded (a name may be up to io::kMaxTensorNameBytes long); the columns
    // between them fixed.
    char b[128];
    std::snprintf(b, sizeof b, " %-5s %-14s %12s", g.dtype.c_str(), io::shape_str(g.shape).c_str(),
                  commas(g.numel).c_str());
    out += "  " + name + std::string(name.size() < 58 ? 58 - name.size() : 0, ' ') + b + suffix + "\n";
  }
  *total_numel = total;
  return out;
}

// "(equal to the config's count)" or the difference, for the tensors' total against the config.
std::string against_config(long long numel, const model::ModelConfig& c) {
  const long long want = model::count_params(c).total;
  return numel == want ? " (equal to the config's count)"
                       : str_cat(" (the config counts ", commas(want), ": ", commas(numel - want), " apart)");
}

std::string inspect_safetensors_file(const std::string& path) {
  const io::DataFile df = io::open_data_file(path, "safetensors file", io::Origin::kNamed);
  io::SafetensorsFile f = io::SafetensorsFile::from_fd(df.fd(), path);
  std::string out;
  line(out, "safetensors", str_cat(path, " (", mb(static_cast<double>(df.size())), ")"));
  for (const auto& [k, v] : f.metadata()) line(out, "metadata", str_cat(k, " = ", v));
  std::map<std::string, long long> by_dtype;
  for (const io::TensorInfo& t : f.tensors()) by_dtype[t.dtype] += t.numel();
  long long numel = 0;
  const std::string list = list_tensors(f.tensors(), &numel);
  std::string dt;
  for (const auto& [d, n] : by_dtype) dt += str_cat(dt.empty() ? "" : ", ", d, " ", commas(n));
  line(out, "tensors", str_cat(f.tensors().size(), ", ", commas(numel), " elements (", dt, ")"));
  return out + list;
}

std::string inspect_checkpoint(const std::string& dir) {
  const train::Manifest m = train::read_manifest(dir);
  const std::string mpath = dir + "/manifest.json";
  const model::ModelConfig c = model::config_from_json(m.meta.config, mpath);
  std::string out;
  line(out, "checkpoint", str_cat(dir, " (", train::kCheckpointFormat, ")"));
  line(out, "step", str_cat(m.meta.step, " (", m.meta.bad_steps, " non-finite step(s) skipped before it)"));
  line(out, "seed", str_cat(m.meta.seed, ", data cursor ", m.meta.data_rng_state));
  const json& p = m.meta.parallel;
  auto get = [&](const char* k) { return p.is_object() && p.contains(k) ? p[k].dump() : std::string("?"); };
  line(out, "layout",
       str_cat("pp ", get("pp"), " x dp ", get("dp"), " x ep ", get("ep"), " x tp ", get("tp"),
               ", layers per stage ", get("layers_per_stage"), ", micro-batches ", get("micro_batches"),
               ", batch per rank ", get("batch_per_rank"), ", a2a ", get("a2a")));
  if (m.meta.expert_placement.is_object() && !m.meta.expert_placement.empty()) {
    // Each EP rank's logical experts in slot order (older checkpoints: the EP rank of each expert).
    std::string pl;
    bool moved = false, older = false;
    for (const auto& [layer, ranks] : m.meta.expert_placement.items()) {
      pl += str_cat(pl.empty() ? "" : "; ", "layer ", layer, " ", ranks.dump());
      older = older || !ranks.is_array() || ranks.empty() || !ranks[0].is_array();
      for (size_t r = 0; !older && r < ranks.size(); ++r)
        for (size_t s = 0; s < ranks[r].size(); ++s)
          moved = moved || ranks[r][s] != static_cast<int>(r * ranks[r].size() + s);
    }
    line(out, "expert placement",
         pl + (older   ? " (EP rank of each logical expert)"
               : moved ? " (each EP rank's experts by slot; moved by migration)"
                       : " (each EP rank's experts by slot; contiguous)"));
  }
  describe_config(out, c);
  // Tensors from the shards (the manifest's sizes are checked on open; checksums are not read:
  // that is `moetrain train --resume`'s and export's job).
  std::vector<io::TensorInfo> weights, moments;
  uint64_t bytes = 0;
  for (const auto& [shard, info] : m.shards) {
    const int fd = train::open_shard(dir, shard, info);
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    const io::SafetensorsFile f = io::SafetensorsFile::from_fd(fd, dir + "/" + shard);
    line(out, "shard",
         str_cat(shard, "  ", mb(static_cast<double>(info.bytes)), "  fnv1a64 ", info.fnv1a64, "  ",
                 f.tensors().size(), " tensors"));
    bytes += info.bytes;
    for (const io::TensorInfo& t : f.tensors())
      (t.name.rfind("adam_m.", 0) == 0 || t.name.rfind("adam_v.", 0) == 0 ? moments : weights).push_back(t);
  }
  long long numel = 0;
  const std::string list = list_tensors(weights, &numel);
  line(out, "weights", str_cat(weights.size(), " tensors, ", commas(numel), " parameters", against_config(numel, c)));
  // AdamW state: adam_m.<name> and adam_v.<name> of every weight, same shape.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const io::TensorInfo& t : moments) shapes[t.name] = t.shape;
  int missing = 0;
  for (const io::TensorInfo& w : weights)
    for (const char* pre : {"adam_m.", "adam_v."}) {
      auto it = shapes.find(pre + w.name);
      if (it == shapes.end() || it->second != w.shape) ++missing;
    }
  line(out, "optimizer state",
       missing == 0 && moments.size() == 2 * weights.size()
           ? "AdamW adam_m and adam_v of every weight, same shapes"
           : str_cat(moments.size(), " AdamW tensors; ", missing, " weight moment(s) missing or of another shape"));
  line(out, "on disk", str_cat(m.shards.size(), " shard(s), ", mb(static_cast<double>(bytes))));
  return out + "tensors (weights; the routed experts of a layer on one line):\n" + list;
}

std::string inspect_checkpoint_folder(const std::string& dir, const std::vector<std::pair<int, std::string>>& steps) {
  std::string out;
  line(out, "checkpoints", str_cat(dir, ": ", steps.size(), " checkpoint folder(s)"));
  for (const auto& [n, name] : steps) {
    std::error_code ec;
    const bool done = fs::is_regular_file(fs::path(dir) / name / "manifest.json", ec);
    line(out, "  " + name, done ? "complete (manifest.json)" : "incomplete (no manifest.json: does not count)");
  }
  out += str_cat("(moetrain inspect ", dir, "/", steps.back().second, " for its contents)\n");
  return out;
}

std::string inspect_model_folder(const std::string& dir, const std::vector<std::string>& files) {
  // Files found inside the folder: plain files there, never a symlink followed out of it
  // (io/data_file.h), as generate and eval read them.
  const model::ModelConfig c = model::load_config(dir + "/config.json", /*in_folder=*/true);
  std::string out;
  line(out, "model folder", str_cat(dir, " (config.json + ", files.size(), " safetensors file(s))"));
  describe_config(out, c);
  std::vector<io::TensorInfo> all;
  std::vector<io::SafetensorsFile> open;  // keeps names valid while listing
  double bytes = 0;
  for (const std::string& name : files) {
    const io::DataFile df = io::open_in_folder(dir, name, "weight file", "a model folder");
    io::SafetensorsFile f = io::SafetensorsFile::from_fd(df.fd(), dir + "/" + name);
    const double b = static_cast<double>(df.size());
    bytes += b;
    line(out, "file", str_cat(name, "  ", mb(b), "  ", f.tensors().size(), " tensors"));
    all.insert(all.end(), f.tensors().begin(), f.tensors().end());
  }
  long long numel = 0;
  const std::string list = list_tensors(all, &numel);
  line(out, "weights",
       str_cat(all.size(), " tensors, ", commas(numel), " parameters", against_config(numel, c), ", ", mb(bytes)));
  return out + "tensors (the routed experts of a layer on one line):\n" + list;
}

std::string inspect_config_file(const std::string& path) {
  const json j = io::read_json_file(path, "config.json");
  MOE_CHECK(j.is_object(), path, ": not a JSON object (not a config.json or manifest.json)");
  if (j.contains("format") && j["format"] == train::kCheckpointFormat)
    return inspect_checkpoint(fs::path(path).parent_path().string());
  const model::ModelConfig c = model::config_from_json(j, path);
  std::string out;
  line(out, "config", path);
  describe_config(out, c);
  return out;
}

std::string inspect_byte_corpus(const std::string& path) {
  const io::ByteCorpus c = io::ByteCorpus::load(path);
  std::string out;
  line(out, "byte corpus", str_cat(path, " (text read as bytes: tokens 0..255, vocab ", io::ByteCorpus::kVocabSize, ")"));
  line(out, "tokens",
       str_cat(commas(static_cast<long long>(c.size_bytes())), " (training ",
               commas(static_cast<long long>(c.num_tokens(io::Split::kTrain))), ", validation ",
               commas(static_cast<long long>(c.num_tokens(io::Split::kVal))), ")"));
  line(out, "split",
       str_cat("blocks of ", commas(static_cast<long long>(c.block_bytes())), " bytes, every ",
               io::ByteCorpus::kValEvery, "th held out: ", c.segments(io::Split::kTrain).size(), " training and ",
               c.segments(io::Split::kVal).size(), " validation segment(s)"));
  line(out, "documents", "none marked (one stream of bytes; windows never cross a split's segment)");
  return out;
}

#ifdef MOETRAIN_INSPECT_INDEXED
std::string inspect_indexed(const std::string& prefix) {
  const io::IndexedDataset d = io::IndexedDataset::open(prefix);
  std::string out;
  line(out, "indexed dataset", str_cat(prefix, " (Megatron MMIDIDX: ", io::idx_path(prefix), " + ", io::bin_path(prefix), ")"));
  line(out, "dtype", str_cat(io::dtype_name(d.dtype_code()), " (", d.item_size(), " byte(s) per token)"));
  uint64_t tokens = 0, lo = UINT64_MAX, hi = 0;
  for (uint64_t i = 0; i < d.num_sequences(); ++i) {
    const uint64_t n = d.sequence_length(i);
    tokens += n;
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  line(out, "documents", commas(static_cast<long long>(d.num_documents())));
  line(out, "sequences",
       str_cat(commas(static_cast<long long>(d.num_sequences())),
               d.num_sequences() > 0 ? str_cat(" (", lo, " to ", hi, " tokens, mean ", tokens / d.num_sequences(), ")")
                                     : std::string()));
  line(out, "tokens", commas(static_cast<long long>(tokens)));
  return out;
}
#endif

bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

}  // namespace

std::string inspect(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
#ifdef MOETRAIN_INSPECT_INDEXED
  const bool idx_named = ends_with(path, ".idx") || ends_with(path, ".bin");
  if ((idx_named && fs::exists(st)) || (!fs::exists(st) && fs::exists(path + ".idx", ec)))
    return inspect_indexed(idx_named ? path.substr(0, path.size() - 4) : path);
#endif
  MOE_CHECK(fs::exists(st), path, ": no such file or folder");
  if (fs::is_directory(st)) {
    // lstat: a symlinked manifest.json or config.json is refused by its reader, not skipped.
    if (io::entry_exists(path + "/manifest.json")) return inspect_checkpoint(path);
    std::vector<std::string> weights;
    std::vector<std::pair<int, std::string>> steps;
    static const std::regex weight_file(R"(model(-[0-9]+-of-[0-9]+)?\.safetensors)");
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (std::regex_match(name, weight_file)) weights.push_back(name);
      if (const int n = train::checkpoint_step_of(name); n >= 0) steps.push_back({n, name});
    }
    MOE_CHECK(!ec, path, ": cannot list the folder (", ec.message(), ")");
    std::sort(weights.begin(), weights.end());
    std::sort(steps.begin(), steps.end());
    if (io::entry_exists(path + "/config.json") && !weights.empty()) return inspect_model_folder(path, weights);
    if (!steps.empty()) return inspect_checkpoint_folder(path, steps);
    throw Error(str_cat(path, ": not a recognised folder (no manifest.json of a checkpoint, no config.json + "
                              "model*.safetensors of an export, no step-N checkpoints)"));
  }
  MOE_CHECK(fs::is_regular_file(st), path, ": not a regular file or folder");
  if (ends_with(path, ".safetensors")) return inspect_safetensors_file(path);
  if (ends_with(path, ".json")) return inspect_config_file(path);
#ifndef MOETRAIN_INSPECT_INDEXED
  MOE_CHECK(!ends_with(path, ".idx") && !ends_with(path, ".bin"), path,
            ": not a recognised file (indexed .idx/.bin datasets are not supported by this build)");
#endif
  return inspect_byte_corpus(path);
}

}  // namespace moe::report
