// Megatron MMIDIDX indexed dataset: checked reading through mmap, writing (layout in the header).
#include "io/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "io/data_file.h"

namespace moe::io {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

template <class T>
T load_le(const uint8_t* p) {  // the arrays after the 34-byte header are unaligned
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 34-byte header from its bytes (size: how many the file has).
IndexHeader parse_header(const uint8_t* p, size_t size, const std::string& file) {
  MOE_CHECK(size >= kIndexHeaderBytes, file, ": truncated at offset ", size, ": the MMIDIDX header needs ",
            kIndexHeaderBytes, " bytes");
  MOE_CHECK(std::memcmp(p, kMagic, sizeof kMagic) == 0, file,
            ": bad magic at offset 0 (expected \"MMIDIDX\\0\\0\"): not a Megatron indexed dataset index");
  const uint64_t version = load_le<uint64_t>(p + 9);
  MOE_CHECK(version == 1, file, ": version ", version, " at offset 9, expected 1");
  IndexHeader h;
  h.dtype_code = p[17];
  MOE_CHECK(dtype_item_size(h.dtype_code) != 0, file, ": unknown dtype code ", int{h.dtype_code},
            " at offset 17 (known: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16)");
  MOE_CHECK(dtype_is_integer(h.dtype_code), file, ": dtype ", dtype_name(h.dtype_code), " (code ",
            int{h.dtype_code}, ") at offset 17: token ids must be integers");
  h.num_sequences = load_le<uint64_t>(p + 18);
  h.num_document_entries = load_le<uint64_t>(p + 26);
  MOE_CHECK(h.num_document_entries >= 1, file,
            ": document count 0 at offset 26 (the document indices start with a 0 entry, so at least 1)");
  return h;
}

}  // namespace

size_t dtype_item_size(uint8_t code) {
  switch (code) {
    case 1:
    case 2: return 1;
    case 3:
    case 8: return 2;
    case 4:
    case 7: return 4;
    case 5:
    case 6: return 8;
    default: return 0;
  }
}

const char* dtype_name(uint8_t code) {
  static const char* names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return code >= 1 && code <= 8 ? names[code] : "unknown";
}

bool dtype_is_integer(uint8_t code) { return dtype_item_size(code) != 0 && code != 6 && code != 7; }

uint8_t dtype_for_vocab(int vocab_size) { return vocab_size <= 256 ? 1 : (vocab_size < 65500 ? 8 : 4); }

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

IndexHeader read_index_header(const std::string& idx_file) {
  // Beside its dataset prefix: opened as every such file is (io/data_file.h), no symlink followed.
  const DataFile f = open_data_file(idx_file, "dataset index", Origin::kInFolder);
  uint8_t buf[kIndexHeaderBytes];
  size_t got = 0;
  while (got < sizeof buf) {
    ssize_t r = ::read(f.fd(), buf + got, sizeof buf - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return parse_header(buf, got, idx_file);
}

MappedFile MappedFile::open(const std::string& path, const std::string& what) {
  // A dataset's files sit beside its prefix: O_NOFOLLOW, O_NONBLOCK, a regular file by fstat and
  // sized on the descriptor (io::open_data_file), as a checkpoint's shards.
  const DataFile f = open_data_file(path, what, Origin::kInFolder);
  MappedFile m;
  m.size_ = static_cast<size_t>(f.size());
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
    if (p == MAP_FAILED)
      throw Error(str_cat(what, " ", path, ": mmap of ", m.size_, " bytes failed: ", std::strerror(errno)));
    m.data_ = static_cast<const uint8_t*>(p);
  }
  return m;  // the mapping outlives the descriptor
}

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  IndexedDataset d;
  d.prefix_ = prefix;
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  d.idx_ = MappedFile::open(ip, "dataset index");
  const uint8_t* p = d.idx_.data();
  const size_t size = d.idx_.size();
  const IndexHeader h = parse_header(p, size, ip);
  d.dtype_ = h.dtype_code;
  d.item_size_ = dtype_item_size(h.dtype_code);
  d.num_sequences_ = h.num_sequences;
  d.num_doc_entries_ = h.num_document_entries;
  const uint64_t S = h.num_sequences, D = h.num_document_entries;

  // Where each array must end; a count too large for the file is caught before any multiply
  // could overflow (12 bytes per sequence, 8 per document entry).
  const uint64_t room = size - kIndexHeaderBytes;
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max() / 32;
  const std::string need_total =
      S < kHuge && D < kHuge ? std::to_string(kIndexHeaderBytes + 12 * S + 8 * D) : std::string("more than 2^59");
  auto truncated = [&](const char* inside, const std::string& need) {
    return Error(str_cat(ip, ": truncated: the file ends at offset ", size, " inside the ", inside, " (", S,
                         " sequences and ", D, " document entries need ", need, " bytes)"));
  };
  if (S > room / 4 || S >= kHuge) throw truncated("sequence lengths", need_total);
  d.lengths_at_ = kIndexHeaderBytes;
  d.pointers_at_ = d.lengths_at_ + 4 * S;
  if (S > (size - d.pointers_at_) / 8) throw truncated("sequence pointers", need_total);
  d.docs_at_ = d.pointers_at_ + 8 * S;
  if (D > (size - d.docs_at_) / 8 || D >= kHuge) throw truncated("document indices", need_total);
  const uint64_t end = d.docs_at_ + 8 * D, extra = size - end;
  MOE_CHECK(extra == 0 || extra == S, ip, ": ", extra, " unexpected bytes after the document indices at offset ",
            end, " (expected none, or ", S, " sequence modes of a multimodal dataset)");

  d.bin_ = open_data_file(bp, "dataset token file", Origin::kInFolder);
  d.bin_size_ = d.bin_.size();
  const uint64_t bin_size = d.bin_size_;
  uint64_t prev_end = 0;  // where sequence i-1 ends in the .bin (bytes)
  for (uint64_t i = 0; i < S; ++i) {
    if ((i & 0xFFFFF) == 0xFFFFF) check_stop(ip);
    const int32_t len = load_le<int32_t>(p + d.lengths_at_ + 4 * i);
    const int64_t ptr = load_le<int64_t>(p + d.pointers_at_ + 8 * i);
    MOE_CHECK(len >= 0, ip, ": sequence ", i, " has length ", len, " at offset ", d.lengths_at_ + 4 * i);
    MOE_CHECK(ptr >= 0 && static_cast<uint64_t>(ptr) % d.item_size_ == 0, ip, ": sequence ", i, " pointer ", ptr,
              " at offset ", d.pointers_at_ + 8 * i, " is not a non-negative multiple of the ", d.item_size_,
              "-byte ", dtype_name(d.dtype_), " items");
    const uint64_t stop = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * d.item_size_;
    if (static_cast<uint64_t>(ptr) > bin_size || stop > bin_size)
      throw Error(str_cat(bp, ": shorter than the index says: sequence ", i, " (", len, " tokens at byte offset ",
                          ptr, ", ", ip, " offset ", d.pointers_at_ + 8 * i, ") ends at byte ", stop,
                          ", the file has ", bin_size, " bytes"));
    // In order and disjoint: a token is in at most one sequence, so the token check at load is
    // one pass over the .bin (100,000 sequences over the same 1 MB once took 10^11 checks).
    if (static_cast<uint64_t>(ptr) < prev_end)
      throw Error(str_cat(ip, ": sequence ", i, " pointer ", ptr, " at offset ", d.pointers_at_ + 8 * i,
                          " overlaps or precedes sequence ", i - 1, ", which ends at byte ", prev_end,
                          ": sequence pointers must increase without overlap"));
    prev_end = stop;
  }
  uint64_t prev = 0;
  for (uint64_t j = 0; j < D; ++j) {
    if ((j & 0xFFFFF) == 0xFFFFF) check_stop(ip);
    const int64_t v = load_le<int64_t>(p + d.docs_at_ + 8 * j);
    const uint64_t at = d.docs_at_ + 8 * j;
    MOE_CHECK(j > 0 || v == 0, ip, ": document index 0 is ", v, " at offset ", at, ", expected 0");
    MOE_CHECK(v >= 0 && static_cast<uint64_t>(v) >= prev && static_cast<uint64_t>(v) <= S, ip, ": document index ",
              j, " is ", v, " at offset ", at, " (expected non-decreasing values in [", prev, ", ", S, "])");
    prev = static_cast<uint64_t>(v);
  }
  MOE_CHECK(prev == S, ip, ": the last document index is ", prev, " at offset ", d.docs_at_ + 8 * (D - 1),
            ", expected the sequence count ", S);
  return d;
}

uint64_t IndexedDataset::sequence_length(uint64_t i) const {
  return static_cast<uint64_t>(load_le<int32_t>(idx_.data() + lengths_at_ + 4 * i));
}
uint64_t IndexedDataset::sequence_pointer(uint64_t i) const {
  return static_cast<uint64_t>(load_le<int64_t>(idx_.data() + pointers_at_ + 8 * i));
}
uint64_t IndexedDataset::document_index(uint64_t j) const {
  return static_cast<uint64_t>(load_le<int64_t>(idx_.data() + docs_at_ + 8 * j));
}

void IndexedDataset::read_bin(uint64_t offset, size_t n, uint8_t* out) const {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(bin_.fd(), out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : 0;
      struct stat st {};
      const long long now = ::fstat(bin_.fd(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
      throw Error(str_cat(bin_path(prefix_), ": changed under the run: reading ", n, " bytes at byte offset ", offset,
                          err ? str_cat(" failed (", std::strerror(err), ")") : std::string(" hit the end of the file"),
                          "; it had ", bin_size_, " bytes when opened, ", now, " now"));
    }
    got += static_cast<size_t>(r);
  }
}

namespace {
template <class Out>
void decode_tokens(uint8_t dtype, const uint8_t* p, uint64_t count, Out* out) {
  switch (dtype) {  // one loop per dtype: this runs for every token of every batch
    // clang-format off
    case 1: for (uint64_t i = 0; i < count; ++i) out[i] = p[i]; break;
    case 2: for (uint64_t i = 0; i < count; ++i) out[i] = load_le<int8_t>(p + i); break;
    case 3: for (uint64_t i = 0; i < count; ++i) out[i] = load_le<int16_t>(p + 2 * i); break;
    case 4: for (uint64_t i = 0; i < count; ++i) out[i] = load_le<int32_t>(p + 4 * i); break;
    case 5: for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<Out>(load_le<int64_t>(p + 8 * i)); break;
    case 8: for (uint64_t i = 0; i < count; ++i) out[i] = load_le<uint16_t>(p + 2 * i); break;
    default: for (uint64_t i = 0; i < count; ++i) out[i] = -1;  // float dtypes are refused at open
      // clang-format on
  }
}
}  // namespace

int64_t IndexedDataset::token_at(uint64_t k) const {
  int64_t v = -1;
  read_tokens(k, 1, &v);
  return v;
}

void IndexedDataset::read_tokens(uint64_t k, uint64_t count, int64_t* out) const {
  if (count == 0) return;
  thread_local std::vector<uint8_t> buf;
  buf.resize(count * item_size_);
  read_bin(k * item_size_, buf.size(), buf.data());
  decode_tokens(dtype_, buf.data(), count, out);
}

void IndexedDataset::copy_tokens(uint64_t k, uint64_t count, int32_t* out) const {
  if (count == 0) return;  // out may be null (an empty window)
  if (dtype_ == 4) {       // the file's bytes are the ids
    read_bin(k * 4, count * 4, reinterpret_cast<uint8_t*>(out));
    return;
  }
  thread_local std::vector<uint8_t> buf;
  buf.resize(count * item_size_);
  read_bin(k * item_size_, buf.size(), buf.data());
  decode_tokens(dtype_, buf.data(), count, out);
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, uint8_t dtype_code, const std::string& flag)
    : prefix_(prefix), flag_(flag), dtype_(dtype_code) {
  MOE_CHECK(dtype_code == 1 || dtype_code == 8 || dtype_code == 4, "indexed dataset writer: dtype ",
            dtype_name(dtype_code), " is not one moetrain writes (uint8, uint16, int32)");
  check_output_path(idx_path(prefix), flag_);  // both targets before any byte is written
  bin_ = std::make_unique<AtomicFile>(bin_path(prefix), flag_);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;  // an unfinished AtomicFile removes its temporary file

void IndexedDatasetWriter::add_document(const int32_t* ids, size_t n) {
  MOE_CHECK(!prepared_ && !finished_, prefix_, ": add_document after finish");
  MOE_CHECK(n <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), prefix_, ": a document of ", n,
            " tokens does not fit Megatron's int32 sequence length");
  const int64_t hi = dtype_ == 1 ? 255 : (dtype_ == 8 ? 65535 : std::numeric_limits<int32_t>::max());
  const size_t item = dtype_item_size(dtype_);
  for (size_t i = 0; i < n; ++i) {
    MOE_CHECK(ids[i] >= 0 && ids[i] <= hi, prefix_, ": token id ", ids[i], " does not fit dtype ", dtype_name(dtype_));
    uint8_t b[4];
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    std::memcpy(b, &v, 4);  // little-endian host (x86-64, aarch64)
    buf_.insert(buf_.end(), b, b + item);
  }
  lengths_.push_back(static_cast<int32_t>(n));
  num_tokens_ += n;
  if (buf_.size() >= (1u << 20)) {
    bin_->write(buf_.data(), buf_.size());
    buf_.clear();
  }
}

void IndexedDatasetWriter::finish() {
  prepare();
  commit();
}

void IndexedDatasetWriter::prepare() {
  MOE_CHECK(!prepared_ && !finished_, prefix_, ": finish called twice");
  bin_->write(buf_.data(), buf_.size());
  buf_.clear();
  // The index: header, lengths, pointers (byte offsets), document indices 0..S.
  const uint64_t S = lengths_.size(), D = S + 1;
  std::vector<uint8_t> idx(kIndexHeaderBytes + 12 * S + 8 * D);
  uint8_t* p = idx.data();
  std::memcpy(p, kMagic, 9);
  const uint64_t version = 1;
  std::memcpy(p + 9, &version, 8);
  p[17] = dtype_;
  std::memcpy(p + 18, &S, 8);
  std::memcpy(p + 26, &D, 8);
  std::memcpy(p + kIndexHeaderBytes, lengths_.data(), 4 * S);
  int64_t ptr = 0;
  for (uint64_t i = 0; i < S; ++i) {
    std::memcpy(p + kIndexHeaderBytes + 4 * S + 8 * i, &ptr, 8);
    ptr += static_cast<int64_t>(lengths_[i]) * static_cast<int64_t>(dtype_item_size(dtype_));
  }
  for (uint64_t j = 0; j < D; ++j) {
    const int64_t v = static_cast<int64_t>(j);
    std::memcpy(p + kIndexHeaderBytes + 12 * S + 8 * j, &v, 8);
  }
  idx_ = std::make_unique<AtomicFile>(idx_path(prefix_), flag_);
  idx_->write(idx.data(), idx.size());
  bin_->sync();
  idx_->sync();
  prepared_ = true;
}

void IndexedDatasetWriter::commit() {
  MOE_CHECK(prepared_ && !finished_, prefix_, ": commit before prepare, or twice");
  bin_->commit();
  idx_->commit();
  finished_ = true;
}

}  // namespace moe::io
