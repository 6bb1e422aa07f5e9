// safetensors read/write: the weight and checkpoint format (Hugging Face names, one file per shard).
// Layout: u64 little-endian N, then N bytes of JSON header
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// then the data section; offsets are relative to its start. The writer pads the header with spaces
// so the data section starts at a multiple of 8 bytes and places tensors back to back in the order
// they were added. The reader maps the file and validates the header fully on open.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/data_file.h"

namespace moe::io {

// Longest tensor name (and __metadata__ key) a reader accepts, in bytes; Hugging Face names are
// under 100. A 40,000-character name is refused on open, naming the file, never echoed back.
constexpr size_t kMaxTensorNameBytes = 1024;

// Size in bytes of one element of a safetensors dtype ("F32" -> 4); throws moe::Error if unknown.
size_t dtype_size(const std::string& dtype);
// Whether dtype is one of the names safetensors defines (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32
// U16 U8 BOOL F8_E4M3 F8_E5M2).
bool is_known_dtype(const std::string& dtype);

struct TensorInfo {
  std::string name;
  std::string dtype;            // "F32", "I32", ...
  std::vector<int64_t> shape;   // empty for a scalar
  uint64_t begin = 0, end = 0;  // byte offsets in the data section, [begin, end)
  int64_t numel() const;
};

// Collects tensors (by pointer: the data must stay valid until write()) and writes one file.
class SafetensorsWriter {
 public:
  // bytes must equal numel(shape) * dtype_size(dtype); names are unique and not "__metadata__".
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
           const void* data, size_t bytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
  void set_metadata(const std::string& key, const std::string& value);

  // The complete header bytes (length field + padded JSON) write() would produce.
  std::string header_bytes() const;
  // Writes the file through io::AtomicFile (io/output_file.h): path must be new or a regular file
  // (never a symlink, device or FIFO); a temporary file created with O_EXCL | O_NOFOLLOW beside it
  // is flushed to disk and renamed onto path. On any failure the temporary file is removed and a
  // moe::Error names `flag` (when given), the path and the OS error (e.g. "No space left").
  void write(const std::string& path, const std::string& flag = "") const;

 private:
  struct Entry {
    TensorInfo info;
    const void* data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// A validated, read-only, memory-mapped safetensors file. Copies share the mapping.
class SafetensorsFile {
 public:
  // Origin::kNamed: a path the user typed (a symlink is followed); kInFolder: a file found inside
  // a folder (a symlink is refused). Either way a regular file, sized on its descriptor.
  static SafetensorsFile open(const std::string& path, Origin origin = Origin::kNamed);
  // Maps an already open file (e.g. opened with O_NOFOLLOW by the checkpoint loader); the fd is
  // not taken over, the caller closes it (the mapping outlives it). Errors name path.
  static SafetensorsFile from_fd(int fd, const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by begin offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws if absent
  // Start of the tensor's bytes inside the mapping (valid while any copy of this object lives).
  const void* data(const std::string& name) const;

  // Copy a tensor into dst after checking its dtype and that its shape equals expected_shape;
  // the error names the file, the tensor, and expected vs actual. Floating-point tensors (F32,
  // F64) must be finite: every float this program reads is a weight or an optimizer moment, and
  // a NaN or Inf one is refused here, naming the tensor and the first bad element.
  void read(const std::string& name, const std::string& dtype, void* dst,
            const std::vector<int64_t>& expected_shape) const;
  void read_f32(const std::string& name, float* dst,
                const std::vector<int64_t>& expected_shape) const;
  void read_i32(const std::string& name, int32_t* dst,
                const std::vector<int64_t>& expected_shape) const;
  std::vector<float> read_f32(const std::string& name) const;  // any shape
  std::vector<int32_t> read_i32(const std::string& name) const;
  // Throws naming the file, the tensor and the first bad element if an F32 / F64 tensor holds a
  // NaN or Inf (other dtypes pass); scans in place, copies nothing out.
  void require_finite(const std::string& name) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> map_;
  const uint8_t* data_section_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"

}  // namespace moe::io
