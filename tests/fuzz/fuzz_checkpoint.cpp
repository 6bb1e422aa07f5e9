// libFuzzer target: the checkpoint manifest. The fuzz bytes are written as manifest.json into a
// checkpoint folder that also holds one real shard (shard-00000.safetensors: tensor "w", F32 [2])
// and, outside it, a file a hostile manifest may try to reach (../outside.safetensors). Then
// train::read_manifest, verify_shards and, when they pass, every listed tensor is read the way
// load_checkpoint_tensors reads it (open_shard + SafetensorsFile::from_fd). A moe::Error is the
// expected answer to bad input. An accepted manifest must keep the rules of
// checkpoint_manifest.h (plain names, every tensor in a listed shard, step in range); anything
// else, a sanitizer report or a crash is a finding.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"
#include "train/checkpoint_manifest.h"

namespace {

struct Folder {
  std::string root, ckpt;
  Folder() {
    const char* t = std::getenv("TMPDIR");
    root = std::string(t && *t ? t : "/tmp") + "/moetrain_fuzz_ckpt_XXXXXX";
    if (!::mkdtemp(root.data())) std::abort();
    ckpt = root + "/step-1";
    if (::mkdir(ckpt.c_str(), 0700) != 0) std::abort();
    const float w[2] = {1.0f, -2.0f};
    moe::io::SafetensorsWriter sw;
    sw.add_f32("w", {2}, w);
    sw.write(ckpt + "/shard-00000.safetensors");
    sw.write(root + "/outside.safetensors");
  }
  ~Folder() {
    for (const char* f : {"/step-1/shard-00000.safetensors", "/step-1/manifest.json",
                          "/outside.safetensors"})
      ::unlink((root + f).c_str());
    ::rmdir(ckpt.c_str());
    ::rmdir(root.c_str());
  }
};

void write_manifest(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Folder folder;
  write_manifest(folder.ckpt + "/manifest.json", data, size);
  try {
    const moe::train::Manifest m = moe::train::read_manifest(folder.ckpt);
    // Accepted: the rules hold.
    if (m.meta.step < 0 || m.meta.bad_steps < 0 || !m.meta.config.is_object()) __builtin_trap();
    for (const auto& [name, shard] : m.tensors)
      if (!moe::train::is_plain_tensor_name(name) || !m.shards.count(shard)) __builtin_trap();
    for (const auto& [name, info] : m.shards)
      if (!moe::train::is_plain_shard_name(name)) __builtin_trap();
    moe::train::verify_shards(folder.ckpt, m);
    for (const auto& [name, shard] : m.tensors) {
      const int fd = moe::train::open_shard(folder.ckpt, shard, m.shards.at(shard));
      moe::io::SafetensorsFile f;
      try {
        f = moe::io::SafetensorsFile::from_fd(fd, folder.ckpt + "/" + shard);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      if (f.has(name) && f.info(name).dtype == "F32") (void)f.read_f32(name);
    }
  } catch (const moe::Error&) {
  }
  return 0;
}
