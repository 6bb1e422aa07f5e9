// Tokenized datasets: the MMIDIDX reader against files written by an independent Python writer
// (tests/fixtures/write_mmidx.py: numpy + struct, every dtype, documents of several sequences,
// gaps between sequences so the pointers matter), the split by documents, window sampling from
// the Rng state alone, the writer's round trip, and every bad file giving one error that names the
// file and the offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/corpus.h"
#include "io/indexed_dataset.h"
#include "io/token_corpus.h"

namespace {

namespace fs = std::filesystem;
using moe::Rng;
using moe::io::IndexedDataset;
using moe::io::Split;
using moe::io::TokenCorpus;

std::string fresh_dir(const std::string& name) { return moe::test_util::fresh_scratch_dir("tok", name); }

bool have_python() {
  const std::string py = MOETRAIN_SYSTEM_PYTHON3;
  return !py.empty() && fs::exists(py);
}

// Runs the Python writer; returns the expected documents (document -> sequences -> tokens).
std::vector<std::vector<std::vector<int64_t>>> python_write(const std::string& prefix, const std::string& args) {
  const std::string cmd = std::string(MOETRAIN_SYSTEM_PYTHON3) + " " + MOETRAIN_SOURCE_DIR +
                          "/tests/fixtures/write_mmidx.py " + prefix + " " + args;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(prefix + ".expected.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  return j["documents"].get<std::vector<std::vector<std::vector<int64_t>>>>();
}

// The split's stream as the header of token_corpus.h defines it: documents d % 20 == 19 are
// validation, each split the concatenation of its documents' sequences in order.
std::vector<int64_t> expected_stream(const std::vector<std::vector<std::vector<int64_t>>>& docs, Split s) {
  std::vector<int64_t> out;
  for (size_t d = 0; d < docs.size(); ++d)
    if ((d % 20 == 19) == (s == Split::kVal))
      for (const auto& seq : docs[d]) out.insert(out.end(), seq.begin(), seq.end());
  return out;
}

using moe::test_util::error_of;

#define SKIP_WITHOUT_PYTHON() \
  if (!have_python()) GTEST_SKIP() << "no /usr/bin/python3 with numpy"

TEST(IndexedDataset, ReadsWhatThePythonWriterWroteInEveryDtype) {
  SKIP_WITHOUT_PYTHON();
  const std::string dir = fresh_dir("dtypes");
  struct Case {
    const char* dtype;
    uint8_t code;
    int max_id;
  };
  for (const Case& c : {Case{"uint8", 1, 256}, Case{"int8", 2, 128}, Case{"int16", 3, 30000},
                        Case{"int32", 4, 100000}, Case{"int64", 5, 100000}, Case{"uint16", 8, 65535}}) {
    const std::string prefix = dir + "/" + c.dtype;
    const auto docs = python_write(prefix, std::string("--dtype ") + c.dtype + " --docs 45 --seqs-per-doc 3 --gap 2 " +
                                               "--max-id " + std::to_string(c.max_id));
    IndexedDataset d = IndexedDataset::open(prefix);
    EXPECT_EQ(d.dtype_code(), c.code) << c.dtype;
    ASSERT_EQ(d.num_documents(), docs.size());
    ASSERT_EQ(d.num_sequences(), docs.size() * 3);
    for (size_t j = 0; j < docs.size(); ++j) {
      ASSERT_EQ(d.document_index(j), j * 3);
      for (size_t s = 0; s < docs[j].size(); ++s) {
        const uint64_t seq = d.document_index(j) + s;
        ASSERT_EQ(d.sequence_length(seq), docs[j][s].size());
        std::vector<int32_t> got(docs[j][s].size());
        d.copy_tokens(d.sequence_pointer(seq) / d.item_size(), got.size(), got.data());
        for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], docs[j][s][k]) << c.dtype << " doc " << j;
      }
    }
  }
}

TEST(TokenCorpus, SplitsByDocumentAndDrawsWindowsFromTheRngAlone) {
  SKIP_WITHOUT_PYTHON();
  const std::string prefix = fresh_dir("split") + "/d";
  const auto docs = python_write(prefix, "--dtype uint16 --docs 60 --seqs-per-doc 2 --gap 3 --max-id 500");
  TokenCorpus c = TokenCorpus::load(prefix, 500);
  const std::vector<int64_t> train = expected_stream(docs, Split::kTrain), val = expected_stream(docs, Split::kVal);
  ASSERT_EQ(c.num_tokens(Split::kTrain), train.size());
  ASSERT_EQ(c.num_tokens(Split::kVal), val.size());  // documents 19, 39, 59
  EXPECT_FALSE(c.has_tokenizer_info());
  EXPECT_EQ(c.val_bytes_per_token(), 0.0);
  const int B = 7, T = 16;
  for (Split s : {Split::kTrain, Split::kVal}) {
    const std::vector<int64_t>& stream = s == Split::kTrain ? train : val;
    ASSERT_EQ(c.num_windows(s, T), stream.size() - T);
    Rng rng(42), mirror(42);
    std::vector<int32_t> batch(B * (T + 1));
    for (int round = 0; round < 20; ++round) {
      c.sample_batch(batch.data(), B, T, rng, s);
      for (int b = 0; b < B; ++b) {
        const uint64_t start = mirror.below(stream.size() - T);  // one below() per row
        for (int t = 0; t <= T; ++t) ASSERT_EQ(batch[b * (T + 1) + t], stream[start + t]) << "row " << b;
      }
    }
    EXPECT_EQ(rng.state(), mirror.state());
  }
  // Fixed validation windows: window i of W starts at floor(i * U / W) of U starts.
  const std::vector<int32_t> vb = c.val_batches(3, T, 2);
  const uint64_t U = val.size() - T, W = 6;
  for (uint64_t i = 0; i < W; ++i)
    for (int t = 0; t <= T; ++t) ASSERT_EQ(vb[i * (T + 1) + t], val[i * U / W + t]);
}

TEST(TokenCorpus, FewerThanTwentyDocumentsHoldNothingOut) {
  SKIP_WITHOUT_PYTHON();
  const std::string prefix = fresh_dir("few") + "/d";
  python_write(prefix, "--docs 19 --max-len 30");
  TokenCorpus c = TokenCorpus::load(prefix, 1000);
  EXPECT_EQ(c.num_tokens(Split::kVal), 0u);
  const std::string e = error_of([&] { c.val_batches(1, 8, 1); });
  EXPECT_NE(e.find("the val split has no window of seq_len+1 = 9 tokens: it has 0 tokens (19 documents"),
            std::string::npos)
      << e;
}

// The bad files of the issue and of the format: each one error line naming file and offset.
TEST(TokenCorpus, BadFilesNameTheFileAndTheOffset) {
  SKIP_WITHOUT_PYTHON();
  const std::string dir = fresh_dir("bad");
  const std::string good = dir + "/good";
  python_write(good, "--dtype uint16 --docs 30 --seqs-per-doc 1 --max-id 300");
  const auto idx_size = fs::file_size(good + ".idx"), bin_size = fs::file_size(good + ".bin");
  int n = 0;
  // Copies the good pair to a new prefix, lets `edit` damage it, returns the load error.
  auto damaged = [&](const std::function<void(const std::string&)>& edit, int vocab = 300) {
    const std::string p = dir + "/case" + std::to_string(n++);
    fs::copy_file(good + ".idx", p + ".idx");
    fs::copy_file(good + ".bin", p + ".bin");
    edit(p);
    return error_of([&] { TokenCorpus::load(p, vocab); });
  };
  auto poke = [](const std::string& path, size_t at, const void* bytes, size_t n_bytes) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n_bytes));
  };
  const uint64_t S = 30;
  std::string e;
  e = damaged([](const std::string& p) { fs::resize_file(p + ".idx", 20); });
  EXPECT_NE(e.find("case0.idx: truncated at offset 20: the MMIDIDX header needs 34 bytes"), std::string::npos) << e;
  e = damaged([&](const std::string& p) { fs::resize_file(p + ".idx", idx_size - 5); });
  EXPECT_NE(e.find(std::string("case1.idx: truncated: the file ends at offset ") + std::to_string(idx_size - 5) +
                   " inside the document indices (30 sequences and 31 document entries need " +
                   std::to_string(idx_size) + " bytes)"),
            std::string::npos)
      << e;
  e = damaged([&](const std::string& p) { fs::resize_file(p + ".idx", 34 + 4 * S + 8); });
  EXPECT_NE(e.find("inside the sequence pointers"), std::string::npos) << e;
  e = damaged([&](const std::string& p) { fs::resize_file(p + ".bin", bin_size - 2); });
  EXPECT_NE(e.find("case3.bin: shorter than the index says: sequence "), std::string::npos) << e;
  EXPECT_NE(e.find("the file has " + std::to_string(bin_size - 2) + " bytes"), std::string::npos) << e;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 0, "MMIDIDY", 7); });
  EXPECT_NE(e.find("case4.idx: bad magic at offset 0"), std::string::npos) << e;
  const uint64_t v2 = 2;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 9, &v2, 8); });
  EXPECT_NE(e.find("case5.idx: version 2 at offset 9, expected 1"), std::string::npos) << e;
  const uint8_t code9 = 9, code7 = 7;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 17, &code9, 1); });
  EXPECT_NE(e.find("case6.idx: unknown dtype code 9 at offset 17"), std::string::npos) << e;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 17, &code7, 1); });
  EXPECT_NE(e.find("case7.idx: dtype float32 (code 7) at offset 17: token ids must be integers"), std::string::npos)
      << e;
  const int64_t five = 5;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 34 + 12 * S + 8 * 10, &five, 8); });
  EXPECT_NE(e.find("case8.idx: document index 10 is 5 at offset " + std::to_string(34 + 12 * S + 8 * 10)),
            std::string::npos)
      << e;
  const int64_t odd = 3;  // not a multiple of uint16's 2 bytes
  e = damaged([&](const std::string& p) { poke(p + ".idx", 34 + 4 * S + 8, &odd, 8); });
  EXPECT_NE(e.find("case9.idx: sequence 1 pointer 3 at offset " + std::to_string(34 + 4 * S + 8)), std::string::npos)
      << e;
  const int32_t negative = -4;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 34 + 4 * 2, &negative, 4); });
  EXPECT_NE(e.find("case10.idx: sequence 2 has length -4 at offset 42"), std::string::npos) << e;
  e = damaged([&](const std::string& p) { fs::resize_file(p + ".idx", idx_size + 3); });
  EXPECT_NE(e.find("3 unexpected bytes after the document indices at offset " + std::to_string(idx_size)),
            std::string::npos)
      << e;
  // A huge sequence count must not overflow the size arithmetic: "truncated", not a crash.
  const uint64_t huge = uint64_t{1} << 62;
  e = damaged([&](const std::string& p) { poke(p + ".idx", 18, &huge, 8); });
  EXPECT_NE(e.find("case12.idx: truncated: the file ends at offset " + std::to_string(idx_size) +
                   " inside the sequence lengths (4611686018427387904 sequences and 31 document entries need "
                   "more than 2^59 bytes)"),
            std::string::npos)
      << e;
  // Token ids against the model's vocabulary (the writer drew ids below 300).
  e = damaged([](const std::string&) {}, 200);
  EXPECT_NE(e.find(".bin: token id "), std::string::npos) << e;
  EXPECT_NE(e.find(">= the model's vocab_size 200"), std::string::npos) << e;
  const uint16_t big = 60000;
  e = damaged([&](const std::string& p) { poke(p + ".bin", 6, &big, 2); });
  EXPECT_NE(e.find("case14.bin: token id 60000 at token 3 (byte offset 6) is >= the model's vocab_size 300"),
            std::string::npos)
      << e;
  e = damaged([](const std::string& p) { fs::remove(p + ".bin"); });
  EXPECT_NE(e.find("case15.bin: cannot open"), std::string::npos) << e;
}

TEST(IndexedDatasetWriter, RoundTripAndNoTemporaryLeftBehind) {
  const std::string dir = fresh_dir("writer");
  for (int vocab : {256, 2048, 100000}) {
    const std::string prefix = dir + "/v" + std::to_string(vocab);
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 25; ++d) {
      std::vector<int32_t> doc;
      for (int k = 0; k < (d * 7) % 11; ++k) doc.push_back((d * 131 + k * 17) % vocab);
      docs.push_back(doc);
    }
    {
      moe::io::IndexedDatasetWriter w(prefix, moe::io::dtype_for_vocab(vocab));
      for (const auto& doc : docs) w.add_document(doc.data(), doc.size());
      w.finish();
    }
    IndexedDataset d = IndexedDataset::open(prefix);
    EXPECT_EQ(d.dtype_code(), vocab <= 256 ? 1 : (vocab < 65500 ? 8 : 4));
    ASSERT_EQ(d.num_documents(), docs.size());
    for (size_t j = 0; j < docs.size(); ++j) {
      ASSERT_EQ(d.sequence_length(j), docs[j].size());
      std::vector<int32_t> got(docs[j].size());
      d.copy_tokens(d.sequence_pointer(j) / d.item_size(), got.size(), got.data());
      EXPECT_EQ(got, docs[j]);
    }
  }
  {
    moe::io::IndexedDatasetWriter w(dir + "/abandoned", 8);
    const int32_t ids[3] = {1, 2, 3};
    w.add_document(ids, 3);
    const int32_t too_big = 70000;
    EXPECT_NE(error_of([&] { w.add_document(&too_big, 1); }).find("token id 70000 does not fit dtype uint16"),
              std::string::npos);
  }  // destroyed before finish(): nothing left
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find("abandoned"), std::string::npos) << e.path();
}

TEST(TokenCorpus, SidecarVocabularyAndCountsAreChecked) {
  const std::string prefix = fresh_dir("sidecar") + "/d";
  std::vector<int32_t> doc(50);
  for (int k = 0; k < 50; ++k) doc[k] = k * 5;
  {
    moe::io::IndexedDatasetWriter w(prefix, 8);
    for (int d = 0; d < 40; ++d) w.add_document(doc.data(), doc.size());
    w.finish();
  }
  moe::io::TokenizerInfo info;
  info.kind = "spm";
  info.model = "d.model";
  info.vocab_size = 300;
  info.documents = 40;
  info.train_tokens = 38 * 50;
  info.val_tokens = 2 * 50;
  info.train_bytes = 38 * 150;
  info.val_bytes = 2 * 175;
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(prefix), info);
  TokenCorpus c = TokenCorpus::load(prefix, 300);
  EXPECT_TRUE(c.has_tokenizer_info());
  EXPECT_EQ(c.tokenizer_kind(), "spm");
  // The sidecar says 3.5 bytes per token, but its model file d.model is not beside the dataset:
  // the bytes cannot be recomputed from the tokens, so they are unknown, not taken on trust.
  EXPECT_EQ(c.val_bytes_per_token(), 0.0);
  std::string e = error_of([&] { TokenCorpus::load(prefix, 256); });
  EXPECT_NE(e.find("d.tokenizer.json: the tokenizer has vocab_size 300, the model only 256 (--vocab-size 300"),
            std::string::npos)
      << e;
  info.val_tokens = 99;
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(prefix), info);
  e = error_of([&] { TokenCorpus::load(prefix, 300); });
  EXPECT_NE(e.find("the sidecar belongs to another dataset"), std::string::npos) << e;
  std::ofstream(moe::io::tokenizer_info_path(prefix)) << R"({"kind": "wordpiece"})";
  e = error_of([&] { TokenCorpus::load(prefix, 300); });
  EXPECT_NE(e.find("field \"kind\" must be \"bytes\" or \"spm\", got \"wordpiece\""), std::string::npos) << e;
}

TEST(Corpus, DataPathKinds) {
  const std::string dir = fresh_dir("kinds");
  std::ofstream(dir + "/t.txt") << "text";
  std::ofstream(dir + "/p.idx") << "x";
  EXPECT_FALSE(moe::io::is_indexed_dataset(dir + "/t.txt"));
  EXPECT_TRUE(moe::io::is_indexed_dataset(dir + "/p"));
  EXPECT_TRUE(moe::io::is_indexed_dataset(dir + "/p.idx"));
  EXPECT_TRUE(moe::io::is_indexed_dataset(dir + "/q.bin"));
  EXPECT_FALSE(moe::io::is_indexed_dataset(dir + "/missing"));
  EXPECT_EQ(moe::io::indexed_prefix(dir + "/p.bin"), dir + "/p");
}

// Issue 42, class 6: sequence pointers that go back or overlap are refused by name (100,000
// sequences over the same 1 MB once meant 10^11 token checks), so each token is checked once.
TEST(IndexedDataset, OverlappingOrOutOfOrderSequencesAreRefused) {
  const std::string dir = fresh_dir("overlap");
  const std::string p = dir + "/d";
  {
    moe::io::IndexedDatasetWriter w(p, 1);
    const std::vector<int32_t> doc(10, 7);
    for (int d = 0; d < 4; ++d) w.add_document(doc.data(), doc.size());
    w.finish();
  }
  const uint64_t S = 4;
  auto set_pointer = [&](uint64_t i, int64_t v) {
    std::fstream f(p + ".idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(34 + 4 * S + 8 * i));
    f.write(reinterpret_cast<const char*>(&v), 8);
  };
  set_pointer(2, 15);  // sequence 1 covers bytes [10, 20)
  std::string e = error_of([&] { IndexedDataset::open(p); });
  EXPECT_NE(e.find("d.idx: sequence 2 pointer 15 at offset " + std::to_string(34 + 4 * S + 16) +
                   " overlaps or precedes sequence 1, which ends at byte 20"),
            std::string::npos)
      << e;
  set_pointer(2, 0);  // every sequence at the start: the hostile case of the issue
  set_pointer(1, 0);
  e = error_of([&] { IndexedDataset::open(p); });
  EXPECT_NE(e.find("sequence 1 pointer 0"), std::string::npos) << e;
  set_pointer(1, 10);
  set_pointer(2, 30);  // a gap (Megatron allows it) is fine
  set_pointer(3, 40);
  fs::resize_file(p + ".bin", 50);
  EXPECT_EQ(error_of([&] { TokenCorpus::load(p, 256); }), "");
}

// Issue 42, class 5: the .bin is read with pread, so one that shrinks under a reader is an error
// naming it at the next read, never a SIGBUS.
TEST(IndexedDataset, ABinTruncatedAfterOpenIsAnErrorNotASignal) {
  const std::string dir = fresh_dir("shrink");
  const std::string p = dir + "/d";
  {
    moe::io::IndexedDatasetWriter w(p, 8);
    std::vector<int32_t> doc(5000);
    for (size_t k = 0; k < doc.size(); ++k) doc[k] = static_cast<int32_t>(k % 300);
    for (int d = 0; d < 40; ++d) w.add_document(doc.data(), doc.size());
    w.finish();
  }
  TokenCorpus c = TokenCorpus::load(p, 300);
  fs::resize_file(p + ".bin", 1000);
  std::vector<int32_t> rows(4 * 65);
  Rng rng(1);
  const std::string e = error_of([&] { c.sample_batch(rows.data(), 4, 64, rng, Split::kTrain); });
  EXPECT_NE(e.find("d.bin: changed under the run: reading "), std::string::npos) << e;
  EXPECT_NE(e.find("it had 400000 bytes when opened, 1000 now"), std::string::npos) << e;
}

// Issue 42, classes 4-5: bytes per token come from the tokens (a byte dataset's token is one
// byte), a sidecar whose byte counts were altered is refused, fingerprints are checked, and the
// data's identity changes with its content even at the same size.
TEST(TokenCorpus, BytesPerTokenAndIdentityComeFromTheData) {
  const std::string dir = fresh_dir("ident");
  const std::string p = dir + "/d";
  std::vector<int32_t> doc(100);
  for (size_t k = 0; k < doc.size(); ++k) doc[k] = static_cast<int32_t>('a' + k % 26);
  {
    moe::io::IndexedDatasetWriter w(p, 1);
    for (int d = 0; d < 40; ++d) w.add_document(doc.data(), doc.size());
    w.finish();
  }
  moe::io::TokenizerInfo info;
  info.kind = "bytes";
  info.vocab_size = 256;
  info.documents = 40;
  info.train_tokens = info.train_bytes = 38 * 100;
  info.val_tokens = info.val_bytes = 2 * 100;
  info.fingerprint = moe::io::byte_tokenizer_fingerprint();
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(p), info);
  TokenCorpus c = TokenCorpus::load(p, 256);
  EXPECT_EQ(c.val_bytes_per_token(), 1.0);
  EXPECT_EQ(c.tokenizer_fingerprint(), moe::io::byte_tokenizer_fingerprint());
  const moe::io::Corpus::Identity before = c.identity();
  info.val_bytes = 2;  // the issue's tampered sidecar: nats/byte 100x too small
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(p), info);
  std::string e = error_of([&] { TokenCorpus::load(p, 256); });
  EXPECT_NE(e.find("d.tokenizer.json: records 3800 + 2 train + val bytes of text, but the tokens decode to 3800 + "
                   "200"),
            std::string::npos)
      << e;
  info.val_bytes = 200;
  info.fingerprint = "bytes-256-0123456789abcdef";
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(p), info);
  e = error_of([&] { TokenCorpus::load(p, 256); });
  EXPECT_NE(e.find("tokenizer fingerprint bytes-256-0123456789abcdef is not the byte tokenizer's"), std::string::npos)
      << e;
  info.fingerprint.clear();  // an old sidecar: a byte tokenizer is known anyway
  moe::io::write_tokenizer_info(moe::io::tokenizer_info_path(p), info);
  EXPECT_EQ(TokenCorpus::load(p, 256).tokenizer_fingerprint(), moe::io::byte_tokenizer_fingerprint());
  // Same size, other content: another identity.
  {
    std::fstream f(p + ".bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('Z');
  }
  const moe::io::Corpus::Identity after = TokenCorpus::load(p, 256).identity();
  EXPECT_EQ(after.bytes, before.bytes);
  EXPECT_NE(after.sample, before.sample);
}

TEST(Fingerprint, MatchRules) {
  using moe::io::check_tokenizer_match;
  const std::string a = moe::io::tokenizer_fingerprint("spm", 300, "model A");
  const std::string b = moe::io::tokenizer_fingerprint("spm", 300, "model B");
  EXPECT_TRUE(moe::io::is_tokenizer_fingerprint(a)) << a;
  EXPECT_FALSE(moe::io::is_tokenizer_fingerprint("spm-300-xyz"));
  EXPECT_FALSE(moe::io::is_tokenizer_fingerprint("wordpiece-300-0123456789abcdef"));
  EXPECT_NE(a, b);
  EXPECT_EQ(check_tokenizer_match(a, "M", a, "D"), "");
  EXPECT_EQ(check_tokenizer_match("", "M", "", "D"), "");
  const std::string e = error_of([&] { check_tokenizer_match(a, "M", b, "D"); });
  EXPECT_NE(e.find("D: tokenizer fingerprint " + b + ", but the model (M) was trained on tokenizer " + a),
            std::string::npos)
      << e;
  EXPECT_NE(check_tokenizer_match("", "M", b, "D").find("note: M records no tokenizer fingerprint"), std::string::npos);
}

}  // namespace
