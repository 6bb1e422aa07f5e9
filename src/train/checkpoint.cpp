#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "io/safetensors.h"

namespace moe::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "moetrain-checkpoint-1";

std::string shard_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d.safetensors", rank);
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Writes text to path atomically (tmp + fsync + rename).
void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  MOE_CHECK(f, tmp, ": cannot open for writing (", std::strerror(errno), ")");
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(fileno(f)) == 0 && ok;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(str_cat(path, ": write failed (", std::strerror(err), ")"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(str_cat(path, ": cannot rename into place (", std::strerror(errno), ")"));
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// step-N -> N, or -1 for anything else (step-N.tmp, other files).
int step_of(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step-", 0) != 0) return -1;
  const std::string digits = n.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoi(digits);
}

// Complete checkpoints under dir, oldest first.
std::vector<std::pair<int, fs::path>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = step_of(e.path());
    if (s >= 0 && e.is_directory() && fs::exists(e.path() / "manifest.json")) out.emplace_back(s, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

uint64_t file_checksum(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  MOE_CHECK(f, path, ": cannot open (", std::strerror(errno), ")");
  uint64_t h = 1469598103934665603ull;
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0)
    for (size_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 1099511628211ull;
  std::fclose(f);
  return h;
}

std::string save_checkpoint(const comm::Group& world, const std::string& dir, int keep,
                            const CheckpointMeta& meta, const CheckpointTensors& t) {
  const bool root = world.rank() == 0;
  const std::string final_dir = dir + "/step-" + std::to_string(meta.step);
  const std::string tmp_dir = final_dir + ".tmp";
  // Every failure is agreed on, so that no rank waits for one that gave up.
  auto agree = [&](const std::string& err) {
    int64_t failed = err.empty() ? 0 : 1;
    if (world.size() > 1) world.allreduce_max(&failed, 1);
    if (failed == 0) return;
    if (root) {
      std::error_code ec;
      fs::remove_all(tmp_dir, ec);
    }
    throw Error(err.empty() ? str_cat(tmp_dir, ": checkpoint failed on another rank") : err);
  };

  std::string err;
  if (root) {
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      MOE_CHECK(!ec, dir, ": cannot create checkpoint folder (", ec.message(), ")");
      fs::remove_all(tmp_dir, ec);
      fs::create_directory(tmp_dir, ec);
      MOE_CHECK(!ec, tmp_dir, ": cannot create (", ec.message(), ")");
    } catch (const Error& e) {
      err = e.what();
    }
  }
  agree(err);

  // Each rank writes the tensors it owns.
  uint64_t checksum = 0, bytes = 0;
  bool wrote = false;
  try {
    io::SafetensorsWriter w;
    w.set_metadata("format", kFormat);
    for (const model::ParamSpec& s : t.layout->specs()) {
      if (!t.owned(s)) continue;
      w.add_f32(s.name, s.shape, t.params + s.offset);
      w.add_f32("adam_m." + s.name, s.shape, t.adam_m + s.offset);
      w.add_f32("adam_v." + s.name, s.shape, t.adam_v + s.offset);
      wrote = true;
    }
    if (wrote) {
      const std::string path = tmp_dir + "/" + shard_name(world.rank());
      w.write(path);
      checksum = file_checksum(path);
      bytes = fs::file_size(path);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree(err);

  // Rank 0 learns every shard's checksum and size, indexes the tensors, writes the manifest last.
  std::vector<int32_t> mine = {wrote ? 1 : 0, static_cast<int32_t>(checksum & 0xffffffffu),
                               static_cast<int32_t>(checksum >> 32), static_cast<int32_t>(bytes & 0x7fffffff),
                               static_cast<int32_t>(bytes >> 31)};
  std::vector<int32_t> all(mine.size() * world.size());
  if (world.size() > 1)
    world.allgather(mine.data(), all.data(), static_cast<int>(mine.size()));
  else
    all = mine;
  if (root) {
    try {
      json shards = json::object(), index = json::object();
      for (int r = 0; r < world.size(); ++r) {
        const int32_t* v = all.data() + r * mine.size();
        if (!v[0]) continue;
        const uint64_t sum = static_cast<uint32_t>(v[1]) | (static_cast<uint64_t>(static_cast<uint32_t>(v[2])) << 32);
        const uint64_t size = static_cast<uint64_t>(static_cast<uint32_t>(v[3])) |
                              (static_cast<uint64_t>(static_cast<uint32_t>(v[4])) << 31);
        const std::string name = shard_name(r);
        shards[name] = {{"bytes", size}, {"fnv1a64", hex64(sum)}};
        io::SafetensorsFile f = io::SafetensorsFile::open(tmp_dir + "/" + name);
        for (const io::TensorInfo& ti : f.tensors())
          if (ti.name.rfind("adam_", 0) != 0) index[ti.name] = name;
      }
      json m = {{"format", kFormat},
                {"step", meta.step},
                {"data_rng_state", std::to_string(meta.data_rng_state)},
                {"seed", std::to_string(meta.seed)},
                {"bad_steps", meta.bad_steps},
                {"config", meta.config},
                {"parallel", meta.parallel},
                {"expert_placement", meta.expert_placement},
                {"tensors", index},
                {"shards", shards}};
      write_file_atomic(tmp_dir + "/manifest.json", m.dump(1) + "\n");
      fsync_dir(tmp_dir);
      std::error_code ec;
      fs::remove_all(final_dir, ec);  // a stale folder of the same step (an earlier run)
      fs::rename(tmp_dir, final_dir, ec);
      MOE_CHECK(!ec, final_dir, ": cannot rename the checkpoint into place (", ec.message(), ")");
      fsync_dir(dir);
      // Prune only now that the new checkpoint is complete.
      if (keep > 0) {
        auto done = complete_checkpoints(dir);
        for (size_t i = 0; i + keep < done.size(); ++i) fs::remove_all(done[i].second, ec);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  agree(err);
  return final_dir;
}

std::string find_latest_checkpoint(const std::string& dir) {
  auto done = complete_checkpoints(dir);
  return done.empty() ? std::string() : done.back().second.string();
}

CheckpointMeta read_checkpoint_meta(const std::string& path, bool verify) {
  const std::string mpath = path + "/manifest.json";
  std::ifstream f(mpath);
  MOE_CHECK(f.good(), mpath, ": no manifest (not a complete checkpoint)");
  json m;
  try {
    m = json::parse(f);
  } catch (const json::exception& e) {
    throw Error(str_cat(mpath, ": not valid JSON (", e.what(), ")"));
  }
  try {
    MOE_CHECK(m.value("format", "") == kFormat, mpath, ": format \"", m.value("format", ""),
              "\" is not ", kFormat);
    CheckpointMeta meta;
    meta.step = m.at("step").get<int>();
    meta.data_rng_state = std::stoull(m.at("data_rng_state").get<std::string>());
    meta.seed = std::stoull(m.at("seed").get<std::string>());
    meta.bad_steps = m.value("bad_steps", 0);
    meta.config = m.at("config");
    meta.parallel = m.value("parallel", json::object());
    meta.expert_placement = m.value("expert_placement", json::object());
    if (verify) {
      for (const auto& [name, info] : m.at("shards").items()) {
        const std::string sp = path + "/" + name;
        std::error_code ec;
        MOE_CHECK(fs::exists(sp, ec), path, ": shard ", name, " is missing");
        const uint64_t size = fs::file_size(sp, ec);
        MOE_CHECK(size == info.at("bytes").get<uint64_t>(), path, ": shard ", name, " has ", size,
                  " bytes, the manifest says ", info.at("bytes").get<uint64_t>(), " (truncated?)");
        MOE_CHECK(hex64(file_checksum(sp)) == info.at("fnv1a64").get<std::string>(), path,
                  ": shard ", name, " checksum mismatch (corrupt)");
      }
    }
    return meta;
  } catch (const json::exception& e) {
    throw Error(str_cat(mpath, ": malformed manifest (", e.what(), ")"));
  } catch (const std::invalid_argument&) {
    throw Error(str_cat(mpath, ": malformed manifest (bad number)"));
  }
}

void load_checkpoint_tensors(const std::string& path, const model::ParamLayout& layout,
                             float* params, float* adam_m, float* adam_v) {
  const std::string mpath = path + "/manifest.json";
  std::ifstream f(mpath);
  MOE_CHECK(f.good(), mpath, ": no manifest (not a complete checkpoint)");
  json index;
  try {
    index = json::parse(f).at("tensors");
  } catch (const json::exception& e) {
    throw Error(str_cat(mpath, ": malformed manifest (", e.what(), ")"));
  }
  std::map<std::string, io::SafetensorsFile> open;
  for (const model::ParamSpec& s : layout.specs()) {
    MOE_CHECK(index.contains(s.name), path, ": tensor \"", s.name,
              "\" is not in the checkpoint (a different model config?)");
    const std::string shard = index[s.name].get<std::string>();
    auto it = open.find(shard);
    if (it == open.end()) it = open.emplace(shard, io::SafetensorsFile::open(path + "/" + shard)).first;
    it->second.read_f32(s.name, params + s.offset, s.shape);
    if (adam_m) it->second.read_f32("adam_m." + s.name, adam_m + s.offset, s.shape);
    if (adam_v) it->second.read_f32("adam_v." + s.name, adam_v + s.offset, s.shape);
  }
}

}  // namespace moe::train
