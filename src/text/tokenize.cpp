// moetrain tokenize (see tokenize.h).
#include "text/tokenize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>

#include "core/error.h"
#include "io/corpus.h"
#include "io/indexed_dataset.h"
#include "io/json_file.h"
#include "io/output_file.h"
#include "io/token_corpus.h"
#include "text/tokenizer.h"

namespace moe::text {
namespace fs = std::filesystem;
namespace {

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(str_cat("--input ", path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str_cat("--input ", path, ": not a regular file"));
  }
  std::string s(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {  // the size it had when opened (a growing file is a snapshot)
    ssize_t r = ::read(fd, s.data() + got, s.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(str_cat("--input ", path, ": read failed: ", std::strerror(err)));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  s.resize(got);
  return s;
}

// Documents of one file's text under the --docs rule (views into text).
void split_documents(std::string_view text, const std::string& mode, std::vector<std::string_view>& docs) {
  if (text.empty()) return;
  if (mode == "file") {
    docs.push_back(text);
    return;
  }
  size_t begin = 0, pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    if (mode == "line") {
      docs.push_back(text.substr(pos, end - pos));
      begin = pos = end;
      continue;
    }
    // paragraph: after a non-blank line, take the blank lines that follow, then end the document.
    const bool blank = end - pos == 1 && text[pos] == '\n';
    pos = end;
    if (!blank) {
      size_t q = pos;
      while (q < text.size() && text[q] == '\n') ++q;
      if (q > pos) {
        docs.push_back(text.substr(begin, q - begin));
        begin = pos = q;
      }
    }
  }
  if (begin < text.size()) docs.push_back(text.substr(begin));
}

}  // namespace

// Long (123 lines): checks every output before reading, tokenizes into temporary files, then
// publishes them together; the temporaries' owners span all three steps.
TokenizeResult run_tokenize(const TokenizeOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  MOE_CHECK(!opts.inputs.empty(), "--input: no input files");
  MOE_CHECK(!opts.output.empty(), "--output must not be empty");
  MOE_CHECK(opts.docs == "paragraph" || opts.docs == "line" || opts.docs == "file",
            "--docs: expected paragraph, line or file, got '", opts.docs, "'");
  const std::string& spec = opts.tokenizer;
  const bool bytes = spec == "bytes", bpe = spec.rfind("bpe:", 0) == 0, spm = spec.rfind("spm:", 0) == 0;
  MOE_CHECK(bytes || bpe || spm, "--tokenizer: expected bytes, bpe:VOCAB or spm:MODEL_PATH, got '", spec, "'");
  int bpe_vocab = 0;
  if (bpe) {
    const std::string n = spec.substr(4);
    MOE_CHECK(!n.empty() && n.size() <= 7 && n.find_first_not_of("0123456789") == std::string::npos,
              "--tokenizer ", spec, ": the vocabulary size must be a positive integer");
    bpe_vocab = std::stoi(n);
  }
  TokenizeResult res;
  res.prefix = io::indexed_prefix(opts.output);
  const fs::path dir = fs::path(res.prefix).parent_path();
  std::error_code ec;
  MOE_CHECK(dir.empty() || fs::is_directory(dir, ec), "--output ", opts.output, ": folder ", dir.string(),
            " does not exist");

  // Every output: a new or regular file (never a link, FIFO or device), none of the inputs
  // (io/output_file.h), checked before anything is read or trained. The SentencePiece model named
  // by spm:PATH may already be PREFIX.model (then it is not copied).
  {
    std::vector<std::string> inputs = opts.inputs;
    if (!bytes) io::check_output_path(res.prefix + ".model", "--output", inputs);
    if (spm) inputs.push_back(spec.substr(4));
    for (const std::string& out : {io::bin_path(res.prefix), io::idx_path(res.prefix), io::tokenizer_info_path(res.prefix)})
      io::check_output_path(out, "--output", inputs);
  }

  std::vector<std::string> texts;
  std::vector<std::string_view> docs;
  for (const std::string& in : opts.inputs) {
    texts.push_back(read_text_file(in));
  }
  for (const std::string& t : texts) split_documents(t, opts.docs, docs);
  MOE_CHECK(!docs.empty(), "--input: every input file is empty");

  // Nothing is written until every document is tokenized: the .bin, .idx, tokenizer model and
  // sidecar go to temporary files beside their targets (O_EXCL | O_NOFOLLOW, io/output_file.h)
  // and are renamed into place together at the end, so a tokenize that fails leaves an existing
  // dataset (its model included) as it was. The model is held in memory until then.
  std::string model_bytes;
  std::unique_ptr<io::Tokenizer> tok;
  if (bytes) {
    tok = std::make_unique<io::ByteTokenizer>();
  } else if (bpe) {
    std::vector<std::string_view> train_docs;
    for (size_t d = 0; d < docs.size(); ++d)
      if (!io::TokenCorpus::is_val_document(d)) train_docs.push_back(docs[d]);
    res.model_path = res.prefix + ".model";
    model_bytes = train_bpe_model(train_docs, bpe_vocab);
    tok = load_spm_bytes(model_bytes, res.model_path);
  } else {
    // Read once: the bytes loaded are the bytes fingerprinted and copied.
    model_bytes = io::read_file_bounded(spec.substr(4), "SentencePiece model", size_t{1} << 30);
    tok = load_spm_bytes(model_bytes, spec.substr(4));
    res.model_path = res.prefix + ".model";
  }
  res.vocab_size = tok->vocab_size();

  io::TokenizerInfo info;
  info.kind = tok->kind();
  info.model = res.model_path.empty() ? "" : fs::path(res.model_path).filename().string();
  info.vocab_size = res.vocab_size;
  info.fingerprint = tok->fingerprint();
  info.documents = docs.size();
  io::IndexedDatasetWriter writer(res.prefix, io::dtype_for_vocab(res.vocab_size), "--output");
  std::vector<int32_t> ids;
  for (size_t d = 0; d < docs.size(); ++d) {
    tok->encode(docs[d], ids);
    MOE_CHECK(tok->decode(ids) == docs[d], "--tokenizer ", spec, ": document ", d,
              " does not decode back to its text (a lossy tokenizer: normalisation or a dummy prefix); "
              "nats per byte would be wrong. Use bytes or bpe:N");
    for (int32_t id : ids)
      MOE_CHECK(id >= 0 && id < res.vocab_size, "--tokenizer ", spec, ": id ", id, " outside the vocabulary of ",
                res.vocab_size);
    writer.add_document(ids.data(), ids.size());
    const bool val = io::TokenCorpus::is_val_document(d);
    (val ? info.val_tokens : info.train_tokens) += ids.size();
    (val ? info.val_bytes : info.train_bytes) += docs[d].size();
  }
  writer.prepare();
  std::unique_ptr<io::AtomicFile> model_file;
  std::error_code same;
  if (!model_bytes.empty() && !(spm && fs::equivalent(spec.substr(4), res.model_path, same))) {
    model_file = std::make_unique<io::AtomicFile>(res.model_path, "--output");
    model_file->write(model_bytes);
    model_file->sync();
  }
  io::AtomicFile sidecar(io::tokenizer_info_path(res.prefix), "--output");
  sidecar.write(io::tokenizer_info_json(info));
  sidecar.sync();
  // Every file is complete on disk: publish them together (the sidecar last, so a reader that sees
  // it sees the files it describes).
  writer.commit();
  if (model_file) model_file->commit();
  sidecar.commit();
  res.fingerprint = info.fingerprint;
  res.documents = docs.size();
  res.tokens = info.train_tokens + info.val_tokens;
  res.bytes = info.train_bytes + info.val_bytes;
  res.val_tokens = info.val_tokens;
  res.val_bytes = info.val_bytes;
  if (opts.progress) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "tokenize: %zu file(s), %llu documents, %llu bytes -> %llu tokens (%.3f bytes/token; val %llu "
                 "tokens, %.3f bytes/token), vocab %d, %s; wrote %s.{bin,idx,tokenizer.json}%s in %.1f s\n",
                 opts.inputs.size(), static_cast<unsigned long long>(res.documents),
                 static_cast<unsigned long long>(res.bytes), static_cast<unsigned long long>(res.tokens),
                 res.tokens ? static_cast<double>(res.bytes) / res.tokens : 0.0,
                 static_cast<unsigned long long>(res.val_tokens),
                 res.val_tokens ? static_cast<double>(res.val_bytes) / res.val_tokens : 0.0, res.vocab_size,
                 io::dtype_name(io::dtype_for_vocab(res.vocab_size)), res.prefix.c_str(),
                 res.model_path.empty() ? "" : str_cat(" and ", res.model_path).c_str(), s);
  }
  return res;
}

}  // namespace moe::text
