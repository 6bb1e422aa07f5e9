// Tokenized corpus over a Megatron indexed dataset: split by documents, sampling, checks (see
// token_corpus.h for the rules).
#include "io/token_corpus.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/data_file.h"
#include "io/json_file.h"
#include "io/output_file.h"

namespace moe::io {
using nlohmann::json;

std::string tokenizer_info_path(const std::string& prefix) { return prefix + ".tokenizer.json"; }

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

void write_tokenizer_info(const std::string& path, const TokenizerInfo& t, const std::string& flag) {
  json j = {{"format", "moetrain tokenizer sidecar 1"},
            {"kind", t.kind},
            {"vocab_size", t.vocab_size},
            {"documents", t.documents},
            {"split", "document d is validation iff d % 20 == 19"},
            {"train", {{"tokens", t.train_tokens}, {"bytes", t.train_bytes}}},
            {"val", {{"tokens", t.val_tokens}, {"bytes", t.val_bytes}}}};
  if (!t.model.empty()) j["model"] = t.model;
  write_file_atomic(path, j.dump(2) + "\n", flag);
}

TokenCorpus TokenCorpus::load(const std::string& prefix, int vocab_size) {
  TokenCorpus c;
  c.prefix_ = prefix;
  c.data_ = IndexedDataset::open(prefix);
  const IndexedDataset& d = c.data_;
  const size_t item = d.item_size();
  // Documents in order, each sequence a piece of its split's stream; pieces that continue each
  // other in the .bin are merged (a dataset written in order is one piece per run of documents).
  for (uint64_t doc = 0; doc < d.num_documents(); ++doc) {
    Stream& st = is_val_document(doc) ? c.val_ : c.train_;
    for (uint64_t s = d.document_index(doc); s < d.document_index(doc + 1); ++s) {
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
  if (entry_exists(side)) {  // a symlinked sidecar is refused by its reader, not skipped
    c.info_ = read_tokenizer_info(side);
    c.has_info_ = true;
    const TokenizerInfo& t = c.info_;
    MOE_CHECK(t.vocab_size <= vocab_size, side, ": the tokenizer has vocab_size ", t.vocab_size,
              ", the model only ", vocab_size, " (--vocab-size ", t.vocab_size, ", or a config with vocab_size >= ",
              t.vocab_size, ")");
    MOE_CHECK(t.documents == d.num_documents() && t.train_tokens == c.train_.total && t.val_tokens == c.val_.total,
              side, ": describes ", t.documents, " documents and ", t.train_tokens, " + ", t.val_tokens,
              " train + val tokens, but ", idx_path(prefix), " holds ", d.num_documents(), " documents and ",
              c.train_.total, " + ", c.val_.total, ": the sidecar belongs to another dataset");
  }
  // Every token a window can reach, once: ids must index the model's embedding.
  for (const Stream* st : {&c.train_, &c.val_})
    for (const Piece& p : st->pieces)
      for (uint64_t k = p.bin_token; k < p.bin_token + p.length; ++k) {
        const int64_t id = d.token_at(k);
        if (id < 0 || id >= vocab_size)
          throw Error(str_cat(bin_path(prefix), ": token id ", id, " at token ", k, " (byte offset ", k * item, ") is ",
                              id < 0 ? "negative" : str_cat(">= the model's vocab_size ", vocab_size)));
      }
  return c;
}

double TokenCorpus::val_bytes_per_token() const {
  if (!has_info_ || info_.val_tokens == 0) return 0.0;
  return static_cast<double>(info_.val_bytes) / static_cast<double>(info_.val_tokens);
}

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
  // At most one Piece (24 bytes) per sequence; the index and the tokens stay in mmapped pages.
  return static_cast<double>(sizeof(Piece)) * static_cast<double>(read_index_header(idx_path(prefix)).num_sequences);
}

}  // namespace moe::io
