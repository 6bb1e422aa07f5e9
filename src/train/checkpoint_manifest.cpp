// Checkpoint manifest parsing and shard checks. See checkpoint_manifest.h for the rules.
#include "train/checkpoint_manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "io/parse_number.h"
#include "io/safetensors.h"
#include "train/value_ranges.h"

namespace moe::train {
namespace {

using nlohmann::json;

bool plain_chars(const std::string& s) {
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

using io::quoted;  // a name from the manifest in a message: escaped, one line, cut short

// An integer field in [0, INT_MAX]; `dflt` < 0 makes it required.
int small_int(const json& m, const char* f, int dflt, const std::string& mpath) {
  auto it = m.find(f);
  if (it == m.end()) {
    MOE_CHECK(dflt >= 0, mpath, ": field \"", f, "\" is missing");
    return dflt;
  }
  bool ok = false;
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    ok = u <= static_cast<uint64_t>(INT_MAX);
    v = static_cast<int64_t>(u);
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
    ok = v >= 0 && v <= INT_MAX;
  }
  MOE_CHECK(ok, mpath, ": field \"", f, "\" must be an integer in [0, ", INT_MAX, "], got ",
            io::excerpt(*it));
  return static_cast<int>(v);
}

uint64_t u64_string(const json& m, const char* f, const std::string& mpath) {
  auto it = m.find(f);
  MOE_CHECK(it != m.end(), mpath, ": field \"", f, "\" is missing");
  MOE_CHECK(it->is_string(), mpath, ": field \"", f, "\" must be a decimal string, got ",
            io::excerpt(*it));
  return io::parse_int<uint64_t>(it->get<std::string>(), str_cat(mpath, ": field \"", f, "\""));
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

bool is_plain_shard_name(const std::string& name) {
  const std::string ext = ".safetensors";
  return !name.empty() && name.size() <= 255 && plain_chars(name) && name[0] != '.' &&
         name.find("..") == std::string::npos && name.size() > ext.size() &&
         name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
}

bool is_plain_tensor_name(const std::string& name) {
  return !name.empty() && name.size() <= io::kMaxTensorNameBytes && plain_chars(name) &&
         name.find("..") == std::string::npos;
}

int checkpoint_step_of(const std::string& n) {
  if (n.rfind("step-", 0) != 0) return -1;
  const std::string digits = n.substr(5);
  if (digits.size() > 1 && digits[0] == '0') return -1;  // step-007 is not step-7
  return io::try_parse_int<int>(digits, 0, INT_MAX).value_or(-1);
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Manifest parse_manifest(const std::string& text, const std::string& mpath) {
  const json m = io::parse_json(text, mpath);
  MOE_CHECK(m.is_object(), mpath, ": malformed manifest (not a JSON object)");
  const auto fmt = m.find("format");
  const std::string format = fmt != m.end() && fmt->is_string() ? fmt->get<std::string>() : "";
  MOE_CHECK(format == kCheckpointFormat, mpath, ": format \"", format, "\" is not ",
            kCheckpointFormat);

  Manifest out;
  CheckpointMeta& meta = out.meta;
  meta.step = small_int(m, "step", -1, mpath);
  meta.bad_steps = small_int(m, "bad_steps", 0, mpath);
  meta.time_budget_steps = small_int(m, "time_budget_steps", 0, mpath);
  // Stored numbers in the ranges the flags that made them have (train/value_ranges.h).
  check_value("field \"step\"", meta.step, mpath);
  check_value("field \"bad_steps\"", meta.bad_steps, mpath);
  check_value("field \"time_budget_steps\"", meta.time_budget_steps, mpath);
  MOE_CHECK(meta.time_budget_steps == 0 || meta.time_budget_steps >= meta.step, mpath,
            ": field \"time_budget_steps\" ", meta.time_budget_steps, " is below field \"step\" ", meta.step);
  meta.data_rng_state = u64_string(m, "data_rng_state", mpath);
  meta.seed = u64_string(m, "seed", mpath);
  MOE_CHECK(m.contains("config") && m["config"].is_object(), mpath,
            ": field \"config\" must be a JSON object");
  meta.config = m["config"];
  meta.parallel = m.contains("parallel") ? m["parallel"] : json::object();
  meta.expert_placement = m.contains("expert_placement") ? m["expert_placement"] : json::object();
  MOE_CHECK(meta.parallel.is_object() && meta.expert_placement.is_object(), mpath,
            ": fields \"parallel\" and \"expert_placement\" must be JSON objects");
  meta.router_bias = m.contains("router_bias") ? m["router_bias"] : json();
  MOE_CHECK(meta.router_bias.is_null() || meta.router_bias.is_object(), mpath,
            ": field \"router_bias\" must be a JSON object {\"layer\": [E numbers]} or null");
  meta.data = m.contains("data") ? m["data"] : json();
  if (!meta.data.is_null()) {
    const json& d = meta.data;
    const bool ok = d.is_object() && d.contains("file") && d["file"].is_string() &&
                    d["file"].get<std::string>().size() <= 4096 && d.contains("bytes") &&
                    d["bytes"].is_number_unsigned() && d.contains("sample") && d["sample"].is_string() &&
                    d["sample"].get<std::string>().size() == 16 &&
                    d["sample"].get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos &&
                    (!d.contains("mtime_ns") || d["mtime_ns"].is_number_integer());
    MOE_CHECK(ok, mpath, ": field \"data\" must be {\"file\": path, \"bytes\": n, \"sample\": 16 hex digits, \"mtime_ns\": n} or null");
  }

  MOE_CHECK(m.contains("shards") && m["shards"].is_object(), mpath,
            ": field \"shards\" must be a JSON object {file: {\"bytes\": n, \"fnv1a64\": hex}}");
  for (const auto& [name, info] : m["shards"].items()) {
    MOE_CHECK(is_plain_shard_name(name), mpath, ": shard name ", quoted(name),
              " is not a plain file name inside the checkpoint folder (allowed: letters, digits, "
              "'.', '_', '-'; no \"..\", no '/', ending .safetensors)");
    MOE_CHECK(info.is_object(), mpath, ": shard ", name, ": entry must be a JSON object");
    MOE_CHECK(info.contains("bytes") && info["bytes"].is_number_unsigned(), mpath, ": shard ",
              name, ": \"bytes\" must be a non-negative integer");
    MOE_CHECK(info.contains("fnv1a64") && info["fnv1a64"].is_string() &&
                  is_hex16(info["fnv1a64"].get<std::string>()),
              mpath, ": shard ", name, ": \"fnv1a64\" must be 16 lowercase hex digits");
    out.shards[name] = {info["bytes"].get<uint64_t>(), info["fnv1a64"].get<std::string>()};
  }

  MOE_CHECK(m.contains("tensors") && m["tensors"].is_object(), mpath,
            ": field \"tensors\" must be a JSON object {tensor: shard}");
  for (const auto& [name, shard] : m["tensors"].items()) {
    MOE_CHECK(is_plain_tensor_name(name), mpath, ": tensor name ", quoted(name),
              " is not a plain tensor name (allowed: letters, digits, '.', '_', '-'; no \"..\")");
    MOE_CHECK(shard.is_string(), mpath, ": tensor ", name, ": its shard must be a file name, got ",
              io::excerpt(shard));
    const std::string s = shard.get<std::string>();
    MOE_CHECK(is_plain_shard_name(s), mpath, ": tensor ", name, ": shard name ", quoted(s),
              " is not a plain file name inside the checkpoint folder");
    MOE_CHECK(out.shards.count(s), mpath, ": tensor ", name, " is in shard ", s,
              ", which \"shards\" does not list (no size or checksum to verify it by)");
    out.tensors[name] = s;
  }
  return out;
}

Manifest read_manifest(const std::string& dir) {
  const std::string mpath = dir + "/manifest.json";
  struct stat st {};
  if (::lstat(mpath.c_str(), &st) != 0) {
    MOE_CHECK(errno != ENOENT && errno != ENOTDIR, mpath, ": no manifest (not a complete checkpoint)");
    throw Error(str_cat(mpath, ": cannot read manifest (", std::strerror(errno), ")"));
  }
  MOE_CHECK(!S_ISLNK(st.st_mode), mpath,
            ": is a symbolic link (refused: a checkpoint reads only plain files inside its folder)");
  MOE_CHECK(S_ISREG(st.st_mode), mpath, ": manifest is not a regular file");
  Manifest m = parse_manifest(io::read_file_bounded(mpath, "checkpoint manifest", kMaxManifestBytes,
                                                    /*no_follow=*/true),
                              mpath);
  // A folder named step-N holds step N: a manifest that says otherwise was moved or edited
  // (resuming it would restart the schedule, the data order and the budget at the wrong step).
  std::string name = dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);
  const int folder_step = checkpoint_step_of(name);
  MOE_CHECK(folder_step < 0 || folder_step == m.meta.step, mpath, ": field \"step\" ", m.meta.step,
            " disagrees with its folder name ", name);
  return m;
}

int open_shard(const std::string& dir, const std::string& shard, const ShardInfo& info) {
  MOE_CHECK(is_plain_shard_name(shard), dir, ": shard name ", quoted(shard),
            " is not a plain file name inside the checkpoint folder");
  // As every data file found inside a folder (io/data_file.h): O_NOFOLLOW (a symlink is refused,
  // not followed out of the folder), O_NONBLOCK (a FIFO in a shard's place is refused instead of
  // blocking the open), a regular file by fstat, its size taken on the descriptor.
  io::DataFile f = io::open_in_folder(dir, shard, "shard", "a checkpoint");
  MOE_CHECK(f.size() == info.bytes, dir, ": shard ", shard, " has ", f.size(), " bytes, the manifest says ",
            info.bytes, " (truncated?)");
  return f.release();
}

uint64_t fd_checksum(int fd, const std::string& path, bool poll_stop) {
  uint64_t h = 1469598103934665603ull;
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    if (poll_stop) io::check_stop(path);  // a large model's shards take seconds (issue 42, class 6)
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    MOE_CHECK(n >= 0, path, ": read failed (", std::strerror(errno), ")");
    if (n == 0) break;
    for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 1099511628211ull;
  }
  return h;
}

namespace {
// AdamW divides by sqrt(v): a negative second moment turns the update into NaN.
void require_non_negative(const io::SafetensorsFile& f, const io::TensorInfo& t) {
  const auto* src = static_cast<const uint8_t*>(f.data(t.name));
  float buf[1024];
  const size_t n = static_cast<size_t>(t.numel());
  for (size_t i0 = 0; i0 < n; i0 += 1024) {
    const size_t k = std::min<size_t>(1024, n - i0);
    std::memcpy(buf, src + i0 * sizeof(float), k * sizeof(float));  // any alignment
    for (size_t j = 0; j < k; ++j)
      MOE_CHECK(buf[j] >= 0.0f, f.path(), ": tensor \"", t.name, "\" holds a negative second moment ",
                buf[j], " at element ", i0 + j, ": refusing a corrupt optimizer state");
  }
}
}  // namespace

void verify_shards(const std::string& dir, const Manifest& m) {
  for (const auto& [name, info] : m.shards) {
    const int fd = open_shard(dir, name, info);
    uint64_t sum = 0;
    io::SafetensorsFile f;
    try {
      sum = fd_checksum(fd, dir + "/" + name, /*poll_stop=*/true);
      if (hex64(sum) == info.fnv1a64) f = io::SafetensorsFile::from_fd(fd, dir + "/" + name);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    MOE_CHECK(hex64(sum) == info.fnv1a64, dir, ": shard ", name, " checksum mismatch (corrupt)");
    // Every float of the checkpoint, not only those a rank will load (an expert another rank
    // holds, an embedding row the data never reads): a checkpoint with NaN / Inf weights or
    // moments is refused while every rank still agrees on setup errors.
    for (const io::TensorInfo& t : f.tensors()) {
      f.require_finite(t.name);
      if (t.dtype == "F32" && t.name.rfind("adam_v.", 0) == 0) require_non_negative(f, t);
    }
  }
}

}  // namespace moe::train
