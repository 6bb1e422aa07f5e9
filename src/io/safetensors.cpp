// safetensors writer and validating reader (see safetensors.h for the layout).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/json_file.h"
#include "io/output_file.h"

namespace moe::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // upstream safetensors refuses > 100 MB too
const char* const kMetadataKey = "__metadata__";

struct DtypeEntry {
  const char* name;
  size_t size;
};
// clang-format off
constexpr DtypeEntry kDtypes[] = {{"F64", 8}, {"F32", 4},  {"F16", 2},     {"BF16", 2},
                                  {"I64", 8}, {"I32", 4},  {"I16", 2},     {"I8", 1},
                                  {"U64", 8}, {"U32", 4},  {"U16", 2},     {"U8", 1},
                                  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
// clang-format on

// numel of a shape, or -1 if a dim is negative or the product would overflow int64.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 16 / d) return -1;
    n *= d;
  }
  return n;
}

std::string errno_str(int err) { return std::strerror(err); }

}  // namespace

bool is_known_dtype(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return true;
  return false;
}

size_t dtype_size(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.size;
  throw Error(str_cat("unknown safetensors dtype \"", dtype, "\""));
}

int64_t TensorInfo::numel() const { return checked_numel(shape); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::add(const std::string& name, const std::string& dtype,
                            const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  MOE_CHECK(!name.empty() && name != kMetadataKey, "safetensors writer: invalid tensor name \"",
            name, "\"");
  MOE_CHECK(is_known_dtype(dtype), "safetensors writer: tensor ", name, ": unknown dtype \"",
            dtype, "\"");
  int64_t n = checked_numel(shape);
  MOE_CHECK(n >= 0, "safetensors writer: tensor ", name, ": invalid shape ", shape_str(shape));
  MOE_CHECK(static_cast<uint64_t>(n) * dtype_size(dtype) == bytes, "safetensors writer: tensor ",
            name, ": ", bytes, " bytes given, shape ", shape_str(shape), " of ", dtype, " needs ",
            static_cast<uint64_t>(n) * dtype_size(dtype));
  MOE_CHECK(data != nullptr || bytes == 0, "safetensors writer: tensor ", name, ": null data");
  for (const auto& e : entries_)
    MOE_CHECK(e.info.name != name, "safetensors writer: tensor \"", name, "\" added twice");
  TensorInfo info{name, dtype, shape, data_bytes_, data_bytes_ + bytes};
  entries_.push_back({std::move(info), data});
  data_bytes_ += bytes;
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const float* data) {
  int64_t n = checked_numel(shape);
  MOE_CHECK(n >= 0, "safetensors writer: tensor ", name, ": invalid shape ", shape_str(shape));
  add(name, "F32", shape, data, static_cast<size_t>(n) * sizeof(float));
}

void SafetensorsWriter::add_i32(const std::string& name, const std::vector<int64_t>& shape,
                                const int32_t* data) {
  int64_t n = checked_numel(shape);
  MOE_CHECK(n >= 0, "safetensors writer: tensor ", name, ": invalid shape ", shape_str(shape));
  add(name, "I32", shape, data, static_cast<size_t>(n) * sizeof(int32_t));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::string SafetensorsWriter::header_bytes() const {
  // ordered_json keeps "__metadata__" first and the tensors in the order they were added.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h[kMetadataKey] = std::move(m);
  }
  for (const auto& e : entries_) {
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = e.info.dtype;
    t["shape"] = e.info.shape;
    t["data_offsets"] = {e.info.begin, e.info.end};
    h[e.info.name] = std::move(t);
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
  uint64_t n = json.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

void SafetensorsWriter::write(const std::string& path, const std::string& flag) const {
  AtomicFile f(path, flag.empty() ? "safetensors file" : flag);
  f.write(header_bytes());
  for (const auto& e : entries_)
    if (e.info.end > e.info.begin) f.write(e.data, e.info.end - e.info.begin);
  f.commit();
}

// ---------------------------------------------------------------------------------------------
// Reader

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path, Origin origin) {
  // io::open_data_file: O_NONBLOCK (a FIFO in the file's place is refused, not waited on), a
  // regular file by fstat, O_NOFOLLOW for a file found inside a folder.
  DataFile f = open_data_file(path, "safetensors file", origin);
  return from_fd(f.fd(), path);
}

// Long (132 lines): one pass over a hostile file, length, header, every tensor entry, the tiling
// of the data section, each check with its own error line in file order (docs/bad_inputs.md).
SafetensorsFile SafetensorsFile::from_fd(int fd, const std::string& path) {
  auto bad = [&](const auto&... what) { return Error(str_cat("safetensors file ", path, ": ", what...)); };

  SafetensorsFile sf;
  sf.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw bad("cannot stat: ", errno_str(errno));
  if (!S_ISREG(st.st_mode)) throw bad("not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    throw bad("file is ", file_size, " bytes, shorter than the 8-byte header length field");
  sf.map_ = std::make_shared<Mapping>();
  void* addr = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) throw bad("cannot map: ", errno_str(errno));
  sf.map_->addr = addr;
  sf.map_->size = file_size;
  const auto* bytes = static_cast<const uint8_t*>(addr);

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  // The length field's value is not printed: for a file that is not a safetensors file it is
  // the file's first 8 bytes ("root:x:0" of /etc/passwd), and an error never quotes a file's bytes.
  if (n > kMaxHeaderBytes)
    throw bad("the header length field (the first 8 bytes) exceeds the limit of ", kMaxHeaderBytes,
              " bytes: not a safetensors file?");
  if (n > file_size - 8)
    throw bad("the header length field (the first 8 bytes) exceeds the ", file_size - 8,
              " bytes that follow it: truncated, or not a safetensors file?");
  const uint64_t data_size = file_size - 8 - n;
  sf.data_section_ = bytes + 8 + n;

  // Parse, noting duplicate top-level keys (nlohmann keeps only the last one silently).
  std::set<std::string> seen;
  std::string duplicate;
  size_t long_name = 0;
  // Depth-bounded (io::parse_json): a header of 100000 nested arrays is an error, not a crash.
  const nlohmann::json h = parse_json(
      std::string_view(reinterpret_cast<const char*>(bytes + 8), n),
      str_cat("safetensors file ", path, ": header"),
      [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
        if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
          const std::string& k = parsed.get_ref<const std::string&>();
          // Names of bounded length, as a checkpoint manifest's (the name itself is not echoed).
          if (k.size() > kMaxTensorNameBytes) {
            if (long_name == 0) long_name = k.size();
          } else if (duplicate.empty() && !seen.insert(k).second) {
            duplicate = k;
          }
        }
        return true;
      });
  if (!h.is_object()) throw bad("header is not a JSON object");
  if (long_name > 0)
    throw bad("a tensor name of ", long_name, " bytes in the header is longer than the limit of ",
              kMaxTensorNameBytes);
  if (!duplicate.empty()) throw bad("tensor name ", quoted(duplicate), " appears twice in the header");

  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          throw bad("__metadata__ value of ", quoted(m.key()), " is not a string");
        sf.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tbad = [&](const auto&... what) { return bad("tensor ", quoted(name), ": ", what...); };
    if (!v.is_object()) throw tbad("entry is not an object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
      if (!v.contains(key)) throw tbad("missing \"", key, "\"");
    TensorInfo info;
    info.name = name;
    if (!v["dtype"].is_string()) throw tbad("\"dtype\" is not a string");
    info.dtype = v["dtype"].get<std::string>();
    if (!is_known_dtype(info.dtype)) throw tbad("unknown dtype ", quoted(info.dtype, 32));
    if (!v["shape"].is_array()) throw tbad("\"shape\" is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer()) throw tbad("\"shape\" holds a non-integer ", excerpt(d));
      if (d.is_number_unsigned()) {
        uint64_t u = d.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          throw tbad("dimension ", u, " is too large");
        info.shape.push_back(static_cast<int64_t>(u));
      } else {
        int64_t s = d.get<int64_t>();
        if (s < 0) throw tbad("negative dimension ", s, " in shape ", excerpt(v["shape"]));
        info.shape.push_back(s);
      }
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw tbad("\"data_offsets\" is not a pair of non-negative integers: ", excerpt(off));
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    if (info.begin > info.end)
      throw tbad("data_offsets begin ", info.begin, " > end ", info.end);
    if (info.end > data_size)
      throw tbad("data_offsets [", info.begin, ", ", info.end,
                 "] out of bounds: the data section has ", data_size, " bytes");
    int64_t numel = checked_numel(info.shape);
    if (numel < 0) throw tbad("shape ", shape_str(info.shape), " is too large");
    uint64_t want = static_cast<uint64_t>(numel) * dtype_size(info.dtype);
    if (info.end - info.begin != want)
      throw tbad("data_offsets [", info.begin, ", ", info.end, "] span ", info.end - info.begin,
                 " bytes but shape ", shape_str(info.shape), " of ", info.dtype, " needs ", want);
    sf.tensors_.push_back(std::move(info));
  }

  // Tensors must tile the data section exactly, as upstream safetensors requires: no overlap,
  // no gap, no trailing bytes.
  std::sort(sf.tensors_.begin(), sf.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (size_t i = 0; i < sf.tensors_.size(); ++i) {
    const TensorInfo& t = sf.tensors_[i];
    if (t.begin < pos)
      throw bad("tensors ", quoted(sf.tensors_[i - 1].name), " and ", quoted(t.name), " overlap (",
                quoted(t.name), " begins at ", t.begin, ", before byte ", pos, ")");
    if (t.begin > pos)
      throw bad("gap in the data section: bytes [", pos, ", ", t.begin, ") belong to no tensor");
    pos = t.end;
    sf.index_[t.name] = i;
  }
  if (pos != data_size)
    throw bad("the data section has ", data_size, " bytes but the tensors cover only ", pos);
  return sf;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "safetensors file ", path_, ": no tensor named ", quoted(name));
  return tensors_[it->second];
}

const void* SafetensorsFile::data(const std::string& name) const {
  return data_section_ + info(name).begin;
}

void SafetensorsFile::read(const std::string& name, const std::string& dtype, void* dst,
                           const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = info(name);
  MOE_CHECK(t.dtype == dtype, "safetensors file ", path_, ": tensor ", quoted(name), " has dtype ",
            t.dtype, ", expected ", dtype);
  MOE_CHECK(t.shape == expected_shape, "safetensors file ", path_, ": tensor ", quoted(name),
            " has shape ", shape_str(t.shape), ", expected ", shape_str(expected_shape));
  if (t.end > t.begin) std::memcpy(dst, data_section_ + t.begin, t.end - t.begin);
  if (dtype == "F32" || dtype == "F64") require_finite(name);
}

namespace {
// Scans n elements of F at src (any alignment: a hostile header may place a tensor at an odd
// offset, so elements are copied out, never dereferenced in place). Throws naming the first
// non-finite element by its index in every dimension ([row, col]: which embedding row, which
// stacked expert) and how many there are.
template <class F>
void scan_finite(const uint8_t* src, const TensorInfo& t, const std::string& where) {
  const size_t n = static_cast<size_t>(t.numel());
  size_t first = n, count = 0;
  F bad = 0;
  F buf[1024];
  for (size_t i0 = 0; i0 < n; i0 += 1024) {
    const size_t m = std::min<size_t>(1024, n - i0);
    std::memcpy(buf, src + i0 * sizeof(F), m * sizeof(F));
    for (size_t j = 0; j < m; ++j) {
      if (std::isfinite(buf[j])) continue;
      if (count++ == 0) {
        first = i0 + j;
        bad = buf[j];
      }
    }
  }
  if (count == 0) return;
  std::vector<int64_t> at(t.shape.size());
  size_t rest = first;
  for (size_t d = t.shape.size(); d-- > 0;) {
    at[d] = static_cast<int64_t>(rest % static_cast<size_t>(t.shape[d]));
    rest /= static_cast<size_t>(t.shape[d]);
  }
  throw Error(str_cat(where, ": tensor ", quoted(t.name), " holds ",
                      std::isnan(bad) ? "NaN" : (bad > 0 ? "+Inf" : "-Inf"), " at ", shape_str(at),
                      " (", count, " non-finite of ", n, " elements): refusing non-finite values"));
}
}  // namespace

void SafetensorsFile::require_finite(const std::string& name) const {
  const TensorInfo& t = info(name);
  const std::string where = str_cat("safetensors file ", path_);
  if (t.dtype == "F32") scan_finite<float>(data_section_ + t.begin, t, where);
  if (t.dtype == "F64") scan_finite<double>(data_section_ + t.begin, t, where);
}

void SafetensorsFile::read_f32(const std::string& name, float* dst,
                               const std::vector<int64_t>& expected_shape) const {
  read(name, "F32", dst, expected_shape);
}

void SafetensorsFile::read_i32(const std::string& name, int32_t* dst,
                               const std::vector<int64_t>& expected_shape) const {
  read(name, "I32", dst, expected_shape);
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  read(name, "F32", out.data(), t.shape);
  return out;
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string& name) const {
  const TensorInfo& t = info(name);
  std::vector<int32_t> out(static_cast<size_t>(t.numel()));
  read(name, "I32", out.data(), t.shape);
  return out;
}

}  // namespace moe::io
