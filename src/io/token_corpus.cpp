// Tokenized corpus over a Megatron indexed dataset: split by documents, sampling, checks (see
// token_corpus.h for the rules).
#include "io/token_corpus.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "io/output_file.h"

namespace moe::io {
using nlohmann::json;

namespace {
// A tokenize writing this prefix holds PREFIX.lock (train::DirLock, flock LOCK_EX) until its
// files are published: a reader that finds it held is refused, naming the writer (issue 42,
// class 3). Only a probe: a tokenize that starts after it and publishes during the load makes the
// files disagree, which the checks below refuse.
void refuse_while_written(const std::string& prefix) {
  const std::string lock = prefix + ".lock";
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;  // no tokenize ever wrote here (or not a file we may open): nothing to wait for
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    throw Error(str_cat(prefix, ": the dataset is being written (", holder.empty() ? "holder unknown" : holder,
                        "; lock file ", lock, "): wait for it to finish"));
  }
  ::close(fd);  // releases the shared lock at once
}

// The folder of a dataset prefix, with its trailing slash ("" for the current folder).
std::string fs_parent(const std::string& prefix) {
  const size_t slash = prefix.find_last_of('/');
  return slash == std::string::npos ? std::string() : prefix.substr(0, slash + 1);
}
}  // namespace

std::string tokenizer_info_path(const std::string& prefix) { return prefix + ".tokenizer.json"; }

namespace {

// Protocol buffers, as much as a SentencePiece ModelProto needs: varints and length-delimited
// fields; every read bounded by its message.
struct ProtoReader {
  const uint8_t* p;
  const uint8_t* end;
  const std::string& path;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      MOE_CHECK(p < end, path, ": not a SentencePiece model (a field ends past its message)");
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Error(str_cat(path, ": not a SentencePiece model (a varint longer than 10 bytes)"));
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    MOE_CHECK(n <= static_cast<uint64_t>(end - p), path, ": not a SentencePiece model (a field of ", n,
              " bytes ends past its message)");
    std::string_view v(reinterpret_cast<const char*>(p), n);
    p += n;
    return v;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1:
        MOE_CHECK(end - p >= 8, path, ": not a SentencePiece model (truncated)");
        p += 8;
        return;
      case 2: bytes(); return;
      case 5:
        MOE_CHECK(end - p >= 4, path, ": not a SentencePiece model (truncated)");
        p += 4;
        return;
      default: throw Error(str_cat(path, ": not a SentencePiece model (wire type ", wire, ")"));
    }
  }
};

}  // namespace

std::vector<uint32_t> spm_piece_bytes(std::string_view model, const std::string& path) {
  std::vector<uint32_t> out;
  ProtoReader r{reinterpret_cast<const uint8_t*>(model.data()), reinterpret_cast<const uint8_t*>(model.data()) + model.size(),
                path};
  while (r.p < r.end) {
    const uint64_t key = r.varint();
    if (key != ((1u << 3) | 2)) {  // ModelProto.pieces = 1
      r.skip(static_cast<uint32_t>(key & 7));
      continue;
    }
    const std::string_view msg = r.bytes();
    ProtoReader m{reinterpret_cast<const uint8_t*>(msg.data()), reinterpret_cast<const uint8_t*>(msg.data()) + msg.size(),
                  path};
    std::string_view piece;
    uint64_t type = 1;  // NORMAL
    while (m.p < m.end) {
      const uint64_t k = m.varint();
      if (k == ((1u << 3) | 2)) piece = m.bytes();
      else if (k == ((3u << 3) | 0)) type = m.varint();
      else m.skip(static_cast<uint32_t>(k & 7));
    }
    uint32_t n = 0;
    if (type == 6) {
      n = 1;                              // BYTE: <0xAB>
    } else if (type == 1 || type == 4) {  // NORMAL, USER_DEFINED: U+2581 (3 bytes) decodes to ' '
      for (size_t i = 0; i < piece.size(); ++i) {
        if (i + 2 < piece.size() && piece.compare(i, 3, "\xE2\x96\x81") == 0) i += 2;
        ++n;
      }
    }
    MOE_CHECK(out.size() < (size_t{1} << 31) - 1, path, ": more than 2^31 pieces");
    out.push_back(n);
  }
  MOE_CHECK(!out.empty(), path, ": not a SentencePiece model (no pieces)");
  return out;
}

TokenizerInfo read_tokenizer_info(const std::string& path) {
  const json j = read_json_file(path, "tokenizer sidecar", /*no_follow=*/true);  // beside the dataset
  MOE_CHECK(j.is_object(), path, ": expected a JSON object");
  auto field = [&](const json& o, const char* name, const std::string& where) -> const json& {
    MOE_CHECK(o.contains(name), path, ": missing field \"", where, name, "\"");
    return o[name];
  };
  auto count = [&](const json& o, const char* name, const std::string& where) {
    const json& v = field(o, name, where);
    MOE_CHECK(v.is_number_unsigned(), path, ": field \"", where, name, "\" must be a non-negative integer, got ",
              excerpt(v));
    return v.get<uint64_t>();
  };
  TokenizerInfo t;
  const json& kind = field(j, "kind", "");
  MOE_CHECK(kind.is_string() && (kind == "bytes" || kind == "spm"), path,
            ": field \"kind\" must be \"bytes\" or \"spm\", got ", excerpt(kind));
  t.kind = kind.get<std::string>();
  if (t.kind == "spm") {
    const json& m = field(j, "model", "");
    MOE_CHECK(m.is_string() && !m.get<std::string>().empty() && m.get<std::string>().find('/') == std::string::npos &&
                  m != "." && m != "..",
              path, ": field \"model\" must be a file name beside the dataset, got ", excerpt(m));
    t.model = m.get<std::string>();
  }
  const uint64_t v = count(j, "vocab_size", "");
  MOE_CHECK(v >= 1 && v <= (1u << 31) - 1, path, ": field \"vocab_size\" must be in [1, 2^31), got ", v);
  t.vocab_size = static_cast<int>(v);
  if (j.contains("fingerprint")) {
    const json& f = j["fingerprint"];
    MOE_CHECK(f.is_string() && is_tokenizer_fingerprint(f.get<std::string>()), path,
              ": field \"fingerprint\" must be \"<bytes|spm>-<vocab>-<16 hex digits>\", got ", excerpt(f));
    t.fingerprint = f.get<std::string>();
    MOE_CHECK(t.fingerprint.rfind(str_cat(t.kind, "-", t.vocab_size, "-"), 0) == 0, path, ": field \"fingerprint\" ",
              excerpt(f), " is not of this tokenizer (kind ", t.kind, ", vocab_size ", t.vocab_size, ")");
  }
  t.documents = count(j, "documents", "");
  for (const char* s : {"train", "val"}) {
    const json& o = field(j, s, "");
    MOE_CHECK(o.is_object(), path, ": field \"", s, "\" must be an object");
    const std::string where = std::string(s) + ".";
    (std::string(s) == "train" ? t.train_tokens : t.val_tokens) = count(o, "tokens", where);
    (std::string(s) == "train" ? t.train_bytes : t.val_bytes) = count(o, "bytes", where);
  }
  return t;
}

std::string tokenizer_info_json(const TokenizerInfo& t) {
  json j = {{"format", "moetrain tokenizer sidecar 1"},
            {"kind", t.kind},
            {"vocab_size", t.vocab_size},
            {"documents", t.documents},
            {"split", "document d is validation iff d % 20 == 19"},
            {"train", {{"tokens", t.train_tokens}, {"bytes", t.train_bytes}}},
            {"val", {{"tokens", t.val_tokens}, {"bytes", t.val_bytes}}}};
  if (!t.model.empty()) j["model"] = t.model;
  if (!t.fingerprint.empty()) j["fingerprint"] = t.fingerprint;
  return j.dump(2) + "\n";
}

void write_tokenizer_info(const std::string& path, const TokenizerInfo& t, const std::string& flag) {
  write_file_atomic(path, tokenizer_info_json(t), flag);
}

TokenCorpus TokenCorpus::load(const std::string& prefix, int vocab_size) {
  TokenCorpus c;
  c.prefix_ = prefix;
  refuse_while_written(prefix);
  c.data_ = IndexedDataset::open(prefix);
  const IndexedDataset& d = c.data_;
  const size_t item = d.item_size();
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  // Documents in order, each sequence a piece of its split's stream; pieces that continue each
  // other in the .bin are merged (a dataset written in order is one piece per run of documents).
  uint64_t polled = 0;
  for (uint64_t doc = 0; doc < d.num_documents(); ++doc) {
    Stream& st = is_val_document(doc) ? c.val_ : c.train_;
    for (uint64_t s = d.document_index(doc); s < d.document_index(doc + 1); ++s) {
      if ((++polled & 0xFFFFF) == 0) check_stop(ip);
      const uint64_t len = d.sequence_length(s), at = d.sequence_pointer(s) / item;
      if (len == 0) continue;
      if (!st.pieces.empty() && st.pieces.back().bin_token + st.pieces.back().length == at)
        st.pieces.back().length += len;
      else
        st.pieces.push_back({st.total, at, len});
      st.total += len;
    }
  }
  const std::string side = tokenizer_info_path(prefix);
  std::vector<uint32_t> piece_bytes;  // bytes per id, when the tokenizer is known
  if (entry_exists(side)) {           // a symlinked sidecar is refused by its reader, not skipped
    c.info_ = read_tokenizer_info(side);
    c.has_info_ = true;
    const TokenizerInfo& t = c.info_;
    MOE_CHECK(t.vocab_size <= vocab_size, side, ": the tokenizer has vocab_size ", t.vocab_size,
              ", the model only ", vocab_size, " (--vocab-size ", t.vocab_size, ", or a config with vocab_size >= ",
              t.vocab_size, ")");
    MOE_CHECK(t.documents == d.num_documents() && t.train_tokens == c.train_.total && t.val_tokens == c.val_.total,
              side, ": describes ", t.documents, " documents and ", t.train_tokens, " + ", t.val_tokens,
              " train + val tokens, but ", ip, " holds ", d.num_documents(), " documents and ",
              c.train_.total, " + ", c.val_.total, ": the sidecar belongs to another dataset");
    if (t.kind == "bytes") {
      MOE_CHECK(t.vocab_size == 256, side, ": a byte tokenizer has vocab_size 256, the sidecar says ", t.vocab_size);
      c.fingerprint_ = byte_tokenizer_fingerprint();
      MOE_CHECK(t.fingerprint.empty() || t.fingerprint == c.fingerprint_, side, ": tokenizer fingerprint ",
                t.fingerprint, " is not the byte tokenizer's ", c.fingerprint_);
      piece_bytes.assign(256, 1);
    } else {
      // The model file beside the dataset, when there: its bytes are the tokenizer's identity.
      const std::string dir = fs_parent(prefix), model = dir + t.model;
      c.fingerprint_ = t.fingerprint;
      if (entry_exists(model)) {
        const std::string bytes = read_file_bounded(model, "SentencePiece model", size_t{1} << 30, /*no_follow=*/true);
        const std::string have = io::tokenizer_fingerprint(t.kind, t.vocab_size, bytes);
        MOE_CHECK(t.fingerprint.empty() || have == t.fingerprint, model, ": tokenizer fingerprint ", have,
                  ", but ", side, " records ", t.fingerprint, ": the model file is not the one this dataset was "
                                                              "tokenized with (tokenize again, or restore it)");
        c.fingerprint_ = have;
        piece_bytes = spm_piece_bytes(bytes, model);
        MOE_CHECK(piece_bytes.size() == static_cast<size_t>(t.vocab_size), model, ": ", piece_bytes.size(),
                  " pieces, but ", side, " says vocab_size ", t.vocab_size);
      }
    }
  }
  // Every token a window can reach, once (the pieces never overlap: IndexedDataset::open refuses
  // overlapping sequences): ids must index the model's embedding. Read a block at a time (the
  // stop flag polled between blocks); the bytes they decode to counted per split.
  uint64_t split_bytes[2] = {0, 0};
  std::vector<int64_t> ids;
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  for (int si = 0; si < 2; ++si)
    for (const Piece& p : (si == 0 ? c.train_ : c.val_).pieces)
      for (uint64_t k0 = p.bin_token; k0 < p.bin_token + p.length; k0 += kChunk) {
        check_stop(bp);
        const uint64_t n = std::min(kChunk, p.bin_token + p.length - k0);
        ids.resize(n);
        d.read_tokens(k0, n, ids.data());
        for (uint64_t i = 0; i < n; ++i) {
          const int64_t id = ids[i];
          if (id < 0 || id >= vocab_size) {
            const uint64_t k = k0 + i;
            throw Error(str_cat(bp, ": token id ", id, " at token ", k, " (byte offset ", k * item, ") is ",
                                id < 0 ? "negative" : str_cat(">= the model's vocab_size ", vocab_size)));
          }
          if (!piece_bytes.empty()) {
            if (static_cast<uint64_t>(id) >= piece_bytes.size())
              throw Error(str_cat(bp, ": token id ", id, " at token ", k0 + i, " is not in the tokenizer's ",
                                  piece_bytes.size(), " pieces (", side, ")"));
            split_bytes[si] += piece_bytes[static_cast<size_t>(id)];
          }
        }
      }
  if (!piece_bytes.empty()) {
    const TokenizerInfo& t = c.info_;
    MOE_CHECK(split_bytes[0] == t.train_bytes && split_bytes[1] == t.val_bytes, side, ": records ", t.train_bytes,
              " + ", t.val_bytes, " train + val bytes of text, but the tokens decode to ", split_bytes[0], " + ",
              split_bytes[1], ": the sidecar was altered or belongs to another dataset");
    if (c.val_.total > 0) c.val_bytes_per_token_ = static_cast<double>(split_bytes[1]) / c.val_.total;
  }
  // What the data is, for a checkpoint (compared at resume): the .bin's and .idx's sizes and
  // sampled blocks of both.
  {
    const DataFile idx = open_data_file(ip, "dataset index", Origin::kInFolder);
    const uint64_t h = sampled_fnv1a64(idx.fd(), idx.size(), ip);
    const DataFile bin = open_data_file(bp, "dataset token file", Origin::kInFolder);
    c.identity_ = {bp, bin.size() + idx.size(), hex16(sampled_fnv1a64(bin.fd(), bin.size(), bp, h)), 0};
    for (int fd : {idx.fd(), bin.fd()}) {
      struct stat st {};
      if (::fstat(fd, &st) == 0)
        c.identity_.mtime_ns = std::max<int64_t>(c.identity_.mtime_ns, st.st_mtim.tv_sec * int64_t{1000000000} + st.st_mtim.tv_nsec);
    }
  }
  return c;
}

double TokenCorpus::val_bytes_per_token() const { return val_bytes_per_token_; }

uint64_t TokenCorpus::num_windows(Split s, int T) const {
  MOE_CHECK(T > 0, "dataset ", prefix_, ": seq_len must be positive, got ", T);
  const uint64_t w = static_cast<uint64_t>(T) + 1, total = stream(s).total;
  return total >= w ? total - w + 1 : 0;
}

void TokenCorpus::check_windows(Split s, int T) const {
  if (num_windows(s, T) > 0) return;
  throw Error(str_cat("dataset ", prefix_, ": the ", split_name(s), " split has no window of seq_len+1 = ", T + 1,
                      " tokens: it has ", stream(s).total, " tokens (", data_.num_documents(),
                      " documents; document d is validation iff d % ", kValEvery, " == ", kValEvery - 1, ")"));
}

void TokenCorpus::copy_window(const Stream& st, uint64_t start, uint64_t len, int32_t* out) const {
  // The piece holding `start`: the last one that begins at or before it.
  auto it = std::upper_bound(st.pieces.begin(), st.pieces.end(), start,
                             [](uint64_t pos, const Piece& p) { return pos < p.start; });
  --it;
  while (len > 0) {
    const uint64_t off = start - it->start, n = std::min(len, it->length - off);
    data_.copy_tokens(it->bin_token + off, n, out);
    out += n;
    start += n;
    len -= n;
    ++it;
  }
}

void TokenCorpus::sample_batch(int32_t* tokens_B_T1, int B, int T, Rng& rng, Split split) const {
  MOE_CHECK(B > 0, "dataset ", prefix_, ": batch size must be positive, got ", B);
  check_windows(split, T);
  const uint64_t total = num_windows(split, T), len = static_cast<uint64_t>(T) + 1;
  for (int b = 0; b < B; ++b)  // one below() per row, in row order, as ByteCorpus
    copy_window(stream(split), rng.below(total), len, tokens_B_T1 + static_cast<size_t>(b) * len);
}

std::vector<int32_t> TokenCorpus::val_batches(int B, int T, int num_batches) const {
  MOE_CHECK(B > 0 && num_batches > 0, "dataset ", prefix_, ": val_batches needs positive B and num_batches, got ",
            B, " and ", num_batches);
  check_windows(Split::kVal, T);
  const uint64_t total = num_windows(Split::kVal, T);
  const uint64_t rows = static_cast<uint64_t>(B) * static_cast<uint64_t>(num_batches), len = T + 1ull;
  std::vector<int32_t> out(rows * len);
  for (uint64_t i = 0; i < rows; ++i)  // window i starts at floor(i * U / W) of U starts, W windows
    copy_window(val_, static_cast<uint64_t>(static_cast<unsigned __int128>(i) * total / rows), len,
                out.data() + i * len);
  return out;
}

double TokenCorpus::resident_bytes(const std::string& prefix) {
  // At most one Piece (24 bytes) per sequence; the index stays in mmapped pages, the tokens in the page cache.
  return static_cast<double>(sizeof(Piece)) * static_cast<double>(read_index_header(idx_path(prefix)).num_sequences);
}

}  // namespace moe::io
