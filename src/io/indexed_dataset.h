// Megatron-LM's indexed dataset ("MMIDIDX", megatron/core/datasets/indexed_dataset.py), read
// through mmap and written by moetrain tokenize, so that datasets made by either tool load in both.
//
// PREFIX.bin: the token ids of every sequence, back to back, in one dtype, no header.
// PREFIX.idx (little-endian, packed, no padding):
//   offset 0   9 bytes  magic "MMIDIDX\0\0"
//   offset 9   u64      version = 1
//   offset 17  u8       dtype code: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16
//   offset 18  u64      S = number of sequences
//   offset 26  u64      D = number of document index entries (documents + 1)
//   offset 34  int32[S] sequence lengths (tokens)
//              int64[S] sequence pointers (byte offsets into .bin)
//              int64[D] document indices: document j is sequences [doc[j], doc[j+1]); doc[0] = 0,
//                       doc[D-1] = S, non-decreasing
//              int8[S]  (multimodal datasets only: a mode per sequence; ignored here)
// Every field is checked when the files are opened; an error names the file and the byte offset.
// Sequence pointers must be in increasing order without overlap (each token of the .bin belongs
// to at most one sequence), so checking the tokens costs one pass over the .bin, never one per
// sequence that covers a token (issue 42, class 6).
//
// The .idx is mapped; the .bin is read with pread, window by window (issue 42, class 5): a .bin
// truncated under a running job is an error naming it at the next read, never a SIGBUS.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/data_file.h"
#include "io/output_file.h"

namespace moe::io {

constexpr size_t kIndexHeaderBytes = 34;

// Item size in bytes of a dtype code, 0 for an unknown code; its numpy name ("uint16").
size_t dtype_item_size(uint8_t code);
const char* dtype_name(uint8_t code);
bool dtype_is_integer(uint8_t code);
// The dtype moetrain writes for token ids below vocab_size: u8 up to 256 ids, u16 below 65500
// (Megatron's own switch point), else i32.
uint8_t dtype_for_vocab(int vocab_size);

std::string idx_path(const std::string& prefix);  // PREFIX.idx
std::string bin_path(const std::string& prefix);  // PREFIX.bin

// The fixed header of PREFIX.idx alone (magic, version, dtype, counts), checked.
struct IndexHeader {
  uint8_t dtype_code = 0;
  uint64_t num_sequences = 0;
  uint64_t num_document_entries = 0;
};
IndexHeader read_index_header(const std::string& idx_file);

// Loops over a dataset's sequences and tokens poll io::check_stop (io/data_file.h).

// A read-only mapping of a whole file beside a dataset prefix (empty files map to nothing): opened
// by io::open_data_file as a file inside a folder, so a symbolic link, FIFO or device is refused.
class MappedFile {
 public:
  MappedFile() = default;
  static MappedFile open(const std::string& path, const std::string& what);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

class IndexedDataset {
 public:
  // Maps PREFIX.idx, opens PREFIX.bin and checks every field of the index against both files
  // (bounds, order, no overlap, alignment, the .bin's size). Throws moe::Error naming the file
  // and offset.
  static IndexedDataset open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  uint8_t dtype_code() const { return dtype_; }
  size_t item_size() const { return item_size_; }
  uint64_t num_sequences() const { return num_sequences_; }
  uint64_t num_documents() const { return num_doc_entries_ - 1; }
  uint64_t sequence_length(uint64_t i) const;   // tokens
  uint64_t sequence_pointer(uint64_t i) const;  // byte offset in .bin
  uint64_t document_index(uint64_t j) const;    // j in [0, num_documents()]
  // Token k of the .bin counted from its start (byte offset k * item_size), as an integer.
  int64_t token_at(uint64_t k) const;
  // count tokens from token position k of the .bin, each converted to int32 (ids are checked
  // to fit at load by the corpus, see TokenCorpus). Read with pread: a .bin that shrank since it
  // was opened is a moe::Error naming it, the offset and its size now.
  void copy_tokens(uint64_t k, uint64_t count, int32_t* out) const;
  // The same tokens as int64 (every integer dtype), for checks.
  void read_tokens(uint64_t k, uint64_t count, int64_t* out) const;
  uint64_t bin_bytes() const { return bin_size_; }  // the .bin's size when it was opened

 private:
  std::string prefix_;
  void read_bin(uint64_t offset, size_t n, uint8_t* out) const;
  MappedFile idx_;
  DataFile bin_;
  uint64_t bin_size_ = 0;
  uint8_t dtype_ = 0;
  size_t item_size_ = 0;
  uint64_t num_sequences_ = 0, num_doc_entries_ = 0;
  size_t lengths_at_ = 0, pointers_at_ = 0, docs_at_ = 0;  // byte offsets of the arrays in .idx
};

// Writes PREFIX.bin and PREFIX.idx: one sequence per document (Megatron's preprocess_data.py
// without --split-sentences). Both are written through io::AtomicFile (io/output_file.h): each
// target must be new or a regular file, the data goes to a temporary file created with O_EXCL |
// O_NOFOLLOW beside it (a planted PREFIX.bin.tmp symlink is never written through), and finish()
// renames both into place; a writer destroyed before finish() removes its temporary files.
// finish() is prepare() (both files complete and on disk under their temporary names) then
// commit() (the renames), so that a caller publishing more files with the dataset (tokenize: the
// tokenizer model and sidecar) renames them all only once every one is prepared.
// Errors name `flag` ("--output") and the path.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, uint8_t dtype_code, const std::string& flag = "dataset");
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;
  // Appends one document of n ids; each must fit the dtype (else moe::Error naming it).
  void add_document(const int32_t* ids, size_t n);
  void finish();
  void prepare();
  void commit();
  uint64_t num_tokens() const { return num_tokens_; }

 private:
  std::string prefix_, flag_;
  uint8_t dtype_;
  std::unique_ptr<AtomicFile> bin_, idx_;
  bool prepared_ = false, finished_ = false;
  uint64_t num_tokens_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<uint8_t> buf_;
};

}  // namespace moe::io
