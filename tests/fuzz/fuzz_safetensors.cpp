// libFuzzer target: SafetensorsFile::open on a file holding the fuzz bytes, then read every tensor
// (checked copy, raw pointer, typed whole-tensor read). A moe::Error is the expected answer to bad
// input; any other exception, a sanitizer report or a crash is a finding.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "fuzz_input_file.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = moe::fuzz::input_file().write(data, size);
  try {
    moe::io::SafetensorsFile f = moe::io::SafetensorsFile::open(path);
    uint64_t total = 0;
    for (const moe::io::TensorInfo& t : f.tensors()) {
      // open() promised: offsets inside the data section, size = numel * dtype size.
      const uint64_t bytes = t.end - t.begin;
      if (t.numel() < 0 || bytes != static_cast<uint64_t>(t.numel()) * moe::io::dtype_size(t.dtype))
        __builtin_trap();
      std::vector<uint8_t> dst(bytes);
      f.read(t.name, t.dtype, dst.data(), t.shape);
      if (bytes && std::memcmp(dst.data(), f.data(t.name), bytes) != 0) __builtin_trap();
      if (t.dtype == "F32") total += f.read_f32(t.name).size();
      if (t.dtype == "I32") total += f.read_i32(t.name).size();
    }
    for (const auto& [k, v] : f.metadata()) total += k.size() + v.size();
    (void)total;
  } catch (const moe::Error&) {
  }
  return 0;
}
