// moetrain tokenize's pieces: the byte tokenizer, a SentencePiece BPE trained here that is
// lossless (newlines, runs of spaces, characters it never saw in training come back exactly),
// documents by paragraph / line / file, the sidecar's per-split bytes and tokens, and errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "core/error.h"
#include "io/indexed_dataset.h"
#include "io/json_file.h"
#include "io/token_corpus.h"
#include "text/tokenize.h"
#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) { return moe::test_util::fresh_scratch_dir("tokz", name); }

std::string chapter(int c) {
  std::string s = "Chapter " + std::to_string(c) + "\n";
  for (int v = 1; v <= 4; ++v)
    s += std::to_string(v) + " And the word of chapter " + std::to_string(c) + " came, saying, verse " +
         std::to_string(v) + ".\n";
  return s + "\n";
}

TEST(TextTokenizer, BytesRoundTrip) {
  auto t = std::make_unique<moe::io::ByteTokenizer>();
  std::vector<int32_t> ids;
  const std::string s = std::string("a\n\xff\x00z", 5);
  t->encode(s, ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', '\n', 255, 0, 'z'}));
  EXPECT_EQ(t->decode(ids), s);
  EXPECT_EQ(t->vocab_size(), 256);
}

TEST(TextTokenizer, TrainedBpeIsLossless) {
  const std::string dir = fresh_dir("bpe");
  std::string text;
  for (int c = 1; c <= 40; ++c) text += chapter(c);
  moe::text::train_bpe({text}, 320, dir + "/m.model");
  auto t = moe::text::load_spm(dir + "/m.model");
  EXPECT_EQ(t->vocab_size(), 320);
  std::vector<int32_t> ids;
  for (const std::string& s : {text, std::string("  two  spaces\n\n\nthree newlines"), std::string("\xc3\xa9t\xc3\xa9 ~|")}) {
    t->encode(s, ids);
    EXPECT_EQ(t->decode(ids), s);
  }
  t->encode(text, ids);
  EXPECT_LT(ids.size(), text.size() / 2) << "merges should compress repetitive text";
  EXPECT_FALSE(fs::exists(dir + "/m.model.tmp"));
  // The one interface (io/tokenizer.h): identity from the file's bytes, unknown ids by number.
  EXPECT_EQ(t->kind(), "spm");
  const std::string bytes = moe::io::read_file_bounded(dir + "/m.model", "model", size_t{1} << 30);
  EXPECT_EQ(t->fingerprint(), moe::io::tokenizer_fingerprint("spm", 320, bytes));
  EXPECT_EQ(moe::text::load_tokenizer("spm:" + dir + "/m.model")->fingerprint(), t->fingerprint());
  EXPECT_EQ(t->decode_token(320), "<|320|>");
  EXPECT_EQ(t->decode_token(ids[0]), t->decode({ids[0]}));
  EXPECT_EQ(moe::text::load_tokenizer("bytes")->fingerprint(), moe::io::byte_tokenizer_fingerprint());
}

TEST(TextTokenizer, Errors) {
  const std::string dir = fresh_dir("err");
  auto what = [](auto f) {
    try {
      f();
    } catch (const moe::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(what([&] { moe::text::train_bpe({"abc"}, 100, dir + "/x.model"); })
                .find("--tokenizer bpe:100: the vocabulary must be in [260, 1000000]"),
            std::string::npos);
  std::ofstream(dir + "/junk.model") << "not a model";
  EXPECT_NE(what([&] { moe::text::load_spm(dir + "/junk.model"); }).find("junk.model: not a SentencePiece model"),
            std::string::npos);
  moe::text::TokenizeOptions o;
  o.inputs = {dir + "/none.txt"};
  o.output = dir + "/out";
  o.progress = false;
  EXPECT_NE(what([&] { moe::text::run_tokenize(o); }).find("--input " + dir + "/none.txt: cannot open"),
            std::string::npos);
  std::ofstream(dir + "/a.txt") << "x\n";
  o.inputs = {dir + "/a.txt"};
  o.tokenizer = "bpe:lots";
  EXPECT_NE(what([&] { moe::text::run_tokenize(o); }).find("--tokenizer bpe:lots: the vocabulary size must be"),
            std::string::npos);
  o.tokenizer = "wordpiece";
  EXPECT_NE(what([&] { moe::text::run_tokenize(o); }).find("expected bytes, bpe:VOCAB or spm:MODEL_PATH, got 'wordpiece'"),
            std::string::npos);
  o.tokenizer = "bytes";
  o.docs = "chapter";
  EXPECT_NE(what([&] { moe::text::run_tokenize(o); }).find("--docs: expected paragraph, line or file"), std::string::npos);
}

// Documents: paragraph (blank lines end one and belong to it), line, file; the sidecar's bytes
// per split add up to the input, and the dataset's tokens are the input's bytes.
TEST(Tokenize, DocumentsAndSplitBytes) {
  const std::string dir = fresh_dir("docs");
  std::string a, b = "last file, no final newline";
  for (int c = 1; c <= 30; ++c) a += chapter(c);
  std::ofstream(dir + "/a.txt") << a;
  std::ofstream(dir + "/b.txt") << b;
  struct Case {
    const char* docs;
    uint64_t expected;
  };
  for (const Case& c : {Case{"paragraph", 31}, Case{"line", 30 * 6 + 1}, Case{"file", 2}}) {
    moe::text::TokenizeOptions o;
    o.inputs = {dir + "/a.txt", dir + "/b.txt"};
    o.output = dir + "/" + c.docs;
    o.docs = c.docs;
    o.progress = false;
    const moe::text::TokenizeResult r = moe::text::run_tokenize(o);
    EXPECT_EQ(r.documents, c.expected) << c.docs;
    EXPECT_EQ(r.bytes, a.size() + b.size());
    EXPECT_EQ(r.tokens, r.bytes);
    const moe::io::TokenizerInfo info = moe::io::read_tokenizer_info(o.output + ".tokenizer.json");
    EXPECT_EQ(info.kind, "bytes");
    EXPECT_EQ(info.train_bytes + info.val_bytes, r.bytes);
    moe::io::IndexedDataset d = moe::io::IndexedDataset::open(o.output);
    std::string back;
    for (uint64_t s = 0; s < d.num_sequences(); ++s)
      for (uint64_t k = 0; k < d.sequence_length(s); ++k)
        back += static_cast<char>(d.token_at(d.sequence_pointer(s) + k));
    EXPECT_EQ(back, a + b) << c.docs;
    if (std::string(c.docs) == "paragraph") {
      // Document 19 is chapter 20, blank line included.
      EXPECT_EQ(d.sequence_length(19), chapter(20).size());
      EXPECT_EQ(info.val_bytes, chapter(20).size());
    }
  }
}

TEST(Tokenize, BpeDatasetTrainsOnTrainingDocumentsOnly) {
  const std::string dir = fresh_dir("bpeds");
  std::string a;
  for (int c = 1; c <= 40; ++c) a += chapter(c);
  std::ofstream(dir + "/a.txt") << a;
  moe::text::TokenizeOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output = dir + "/ds";
  o.tokenizer = "bpe:300";
  o.progress = false;
  const moe::text::TokenizeResult r = moe::text::run_tokenize(o);
  EXPECT_EQ(r.vocab_size, 300);
  EXPECT_EQ(r.model_path, dir + "/ds.model");
  EXPECT_LT(r.tokens, r.bytes);
  moe::io::TokenCorpus c = moe::io::TokenCorpus::load(o.output, 300);
  EXPECT_EQ(c.tokenizer_kind(), "spm");
  EXPECT_GT(c.val_bytes_per_token(), 1.0);
  EXPECT_EQ(c.num_tokens(moe::io::Split::kVal) + c.num_tokens(moe::io::Split::kTrain), r.tokens);
}

// Issue 42, class 3: a tokenize that fails leaves the dataset there, its SentencePiece model
// included, byte for byte; one that succeeds leaves no temporary file and a sidecar whose
// fingerprint is the model's and whose byte counts the tokens reproduce.
TEST(Tokenize, AFailedRunLeavesTheDatasetAsItWas) {
  const std::string dir = fresh_dir("unit");
  std::string a;
  for (int c = 1; c <= 40; ++c) a += chapter(c);
  std::ofstream(dir + "/a.txt") << a;
  moe::text::TokenizeOptions o;
  o.inputs = {dir + "/a.txt"};
  o.output = dir + "/ds";
  o.tokenizer = "bpe:300";
  o.progress = false;
  const moe::text::TokenizeResult r = moe::text::run_tokenize(o);
  const moe::io::TokenizerInfo info = moe::io::read_tokenizer_info(dir + "/ds.tokenizer.json");
  std::ifstream mf(dir + "/ds.model", std::ios::binary);
  const std::string model((std::istreambuf_iterator<char>(mf)), std::istreambuf_iterator<char>());
  EXPECT_EQ(info.fingerprint, moe::io::tokenizer_fingerprint("spm", 300, model));
  EXPECT_EQ(r.fingerprint, info.fingerprint);
  moe::io::TokenCorpus c = moe::io::TokenCorpus::load(o.output, 300);
  EXPECT_DOUBLE_EQ(c.val_bytes_per_token(), static_cast<double>(info.val_bytes) / info.val_tokens);
  EXPECT_EQ(c.tokenizer_fingerprint(), info.fingerprint);
  auto snapshot = [&] {
    std::string all;
    for (const char* ext : {".bin", ".idx", ".model", ".tokenizer.json"}) {
      std::ifstream f(dir + "/ds" + ext, std::ios::binary);
      all += std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()) + "|";
    }
    return all;
  };
  const std::string before = snapshot();
  // Another BPE over text with invalid UTF-8 in a document: it fails after training its model.
  std::ofstream(dir + "/b.txt") << a.substr(0, a.size() / 2) << "caf\xc3 broken\n\n"
                                << a.substr(a.size() / 2);
  o.inputs = {dir + "/b.txt"};
  o.tokenizer = "bpe:320";
  bool failed = false;
  try {
    moe::text::run_tokenize(o);
  } catch (const moe::Error&) {
    failed = true;
  }
  EXPECT_TRUE(failed);
  EXPECT_EQ(snapshot(), before);
  // A tokenizer that cannot be used at all fails the same way.
  std::ofstream(dir + "/junk.model") << "not a model";
  o.tokenizer = "spm:" + dir + "/junk.model";
  EXPECT_THROW(moe::text::run_tokenize(o), moe::Error);
  EXPECT_EQ(snapshot(), before);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
