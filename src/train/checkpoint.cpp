#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/data_file.h"
#include "io/output_file.h"
#include "io/safetensors.h"

namespace moe::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shard_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d.safetensors", rank);
  return buf;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Complete checkpoints under dir, oldest first: real folders (a symlink is not followed out of
// dir) with a conforming step-N name (checkpoint_step_of) and a manifest that is a regular file.
// Anything else is ignored, so a stray step-99999999999 or step-abc breaks neither saving nor
// --resume latest.
std::vector<std::pair<int, fs::path>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int s = checkpoint_step_of(it->path().filename().string());
    if (s < 0) continue;
    std::error_code e1, e2;
    if (fs::symlink_status(it->path(), e1).type() == fs::file_type::directory &&
        fs::symlink_status(it->path() / "manifest.json", e2).type() == fs::file_type::regular)
      out.emplace_back(s, it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

uint64_t file_checksum(const std::string& path) {
  const io::DataFile f = io::open_data_file(path, "checkpoint shard", io::Origin::kInFolder);
  return fd_checksum(f.fd(), path);
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
    w.set_metadata("format", kCheckpointFormat);
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
      json m = {{"format", kCheckpointFormat},
                {"step", meta.step},
                {"data_rng_state", std::to_string(meta.data_rng_state)},
                {"seed", std::to_string(meta.seed)},
                {"bad_steps", meta.bad_steps},
                {"time_budget_steps", meta.time_budget_steps},
                {"config", meta.config},
                {"parallel", meta.parallel},
                {"expert_placement", meta.expert_placement},
                {"router_bias", meta.router_bias},
                {"data", meta.data},
                {"tensors", index},
                {"shards", shards}};
      io::write_file_atomic(tmp_dir + "/manifest.json", m.dump(1) + "\n", "checkpoint manifest");
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
  Manifest m = read_manifest(path);
  if (verify) verify_shards(path, m);
  return std::move(m.meta);
}

void load_checkpoint_tensors(const std::string& path, const model::ParamLayout& layout,
                             float* params, float* adam_m, float* adam_v) {
  const Manifest m = read_manifest(path);
  std::map<std::string, io::SafetensorsFile> open;
  for (const model::ParamSpec& s : layout.specs()) {
    auto t = m.tensors.find(s.name);
    MOE_CHECK(t != m.tensors.end(), path, ": tensor \"", s.name,
              "\" is not in the checkpoint (a different model config?)");
    const std::string& shard = t->second;  // listed in m.shards: parse_manifest checked
    auto it = open.find(shard);
    if (it == open.end()) {
      // Opened without following symlinks, its size checked against the manifest before mapping.
      const int fd = open_shard(path, shard, m.shards.at(shard));
      try {
        it = open.emplace(shard, io::SafetensorsFile::from_fd(fd, path + "/" + shard)).first;
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    // read_f32 refuses NaN / Inf, naming the shard, the tensor and the element.
    it->second.read_f32(s.name, params + s.offset, s.shape);
    if (adam_m) it->second.read_f32("adam_m." + s.name, adam_m + s.offset, s.shape);
    if (adam_v) {
      it->second.read_f32("adam_v." + s.name, adam_v + s.offset, s.shape);
      // AdamW divides by sqrt(v): a negative second moment would turn the update into NaN.
      for (size_t i = 0; i < s.numel; ++i)
        MOE_CHECK(adam_v[s.offset + i] >= 0.0f, path, "/", shard, ": tensor \"adam_v.", s.name,
                  "\" holds a negative second moment ", adam_v[s.offset + i], " at element ", i,
                  ": refusing a corrupt optimizer state");
    }
  }
}

}  // namespace moe::train
