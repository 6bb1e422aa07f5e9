#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "io/token_corpus.h"
#include "io/data_file.h"
#include "io/tokenizer.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/weights_io.h"
#include "train/checkpoint.h"
#include "train/hf_folder.h"
#include "train/run_memory.h"
#include "train/score_bias.h"
#include "train/value_ranges.h"

namespace moe::train {
namespace fs = std::filesystem;

namespace {

// Whether the folder has an entry of that name, a symbolic link included (lstat): a symlinked
// manifest.json or config.json is refused by its reader, not skipped or followed.
bool has_entry(const std::string& p) { return io::entry_exists(p); }

// Refuses a config whose weights this host cannot hold before anything is allocated: the
// model's parameters and gradient block (Model allocates both) plus the host copy read from the
// files. (On a GPU the first two are device memory; the allocator names the bytes if they do not fit.)
void check_fits(const model::ModelConfig& cfg, const std::string& source) {
  cfg.validate(source);
  const double floats = static_cast<double>(model::ParamLayout(cfg).total());
  const bool on_host = kernels::active_device() == Device::kCpu;
  const double need = floats * sizeof(float) * (on_host ? 3.0 : 1.0);
  const AvailableMemory avail = available_memory();
  MOE_CHECK(avail.source.empty() || need <= avail.bytes, source, ": this model needs ", format_bytes(need), " of host memory to ",
            "generate (", static_cast<long long>(floats), " parameters", on_host ? ", their gradient block and the copy read from the files" : " read from the files",
            "), ", format_bytes(avail.bytes), " available (", avail.source, ")");
}

}  // namespace

LoadedModel load_model_for_inference(const std::string& path_in) {
  std::error_code ec;
  MOE_CHECK(fs::is_directory(path_in, ec), path_in,
            ": no such folder (expected a checkpoint step-N folder or an exported model folder)");
  std::string path = path_in;
  // A folder of checkpoints (out/checkpoints): its newest complete one.
  if (!has_entry(path + "/manifest.json") && !has_entry(path + "/config.json")) {
    const std::string latest = find_latest_checkpoint(path);
    MOE_CHECK(!latest.empty(), path, ": neither a checkpoint (manifest.json), a folder of "
                                     "checkpoints, nor an exported model (config.json)");
    path = latest;
  }
  LoadedModel out;
  std::vector<float> host;
  std::optional<ScoreBias> bias;
  out.folder = path;
  if (has_entry(path + "/manifest.json")) {
    const CheckpointMeta meta = read_checkpoint_meta(path, /*verify=*/true);
    out.source = path + "/manifest.json";
    const model::ModelConfig cfg = model::config_from_json(meta.config, out.source);
    check_fits(cfg, out.source);
    out.model = std::make_unique<model::Model>(cfg);
    host.resize(out.model->num_params());
    load_checkpoint_tensors(path, out.model->layout(), host.data(), nullptr, nullptr);
    bias.emplace(cfg, std::nullopt);
    if (bias->active()) bias->load_json(meta.router_bias, out.source + ": field \"router_bias\"");
  } else {
    out.source = path + "/config.json";
    const HfFolder hf = HfFolder::open(path);  // train/hf_folder.h: also train --init-from's reader
    check_fits(hf.config(), out.source);
    out.model = std::make_unique<model::Model>(hf.config());
    host.resize(out.model->num_params());
    hf.check(out.model->layout());
    hf.read(out.model->layout(), host.data());
    // noaux_tc: the routers' selection biases must be there (train --init-from may start without).
    bias.emplace(hf.config(), std::nullopt);
    if (bias->active()) {
      const nlohmann::json b = hf.score_bias_json();
      for (int l : model::score_bias_layers(hf.config()))
        MOE_CHECK(b.is_object() && b.contains(std::to_string(l)), path, ": tensor \"", model::score_bias_name(l),
                  "\" is missing (the noaux_tc router's selection bias: without it the model routes "
                  "differently than it trained)");
      bias->load_json(b, path);
    }
  }
  device_copy(out.model->device(), out.model->params(), Device::kCpu, host.data(),
              host.size() * sizeof(float));
  bias->apply(*out.model);  // noaux_tc: the routers' selection biases
  return out;
}

int32_t sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng) {
  const int V = static_cast<int>(logits.size());
  MOE_CHECK(V > 0, "sampling: no logits");
  for (int i = 0; i < V; ++i)
    MOE_CHECK(std::isfinite(logits[i]), "sampling: logit of token ", i, " is ", logits[i],
              " (the model's output is not finite)");
  if (temperature == 0.0f) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  // Candidates by logit, descending (ties: lower id first); keep the top k.
  std::vector<int32_t> ids(V);
  for (int i = 0; i < V; ++i) ids[i] = i;
  const int keep = top_k > 0 && top_k < V ? top_k : V;
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  ids.resize(keep);
  // p_i ∝ exp((l_i - l_max) / temperature), summed in double; one uniform draw.
  std::vector<double> w(keep);
  double sum = 0.0;
  for (int j = 0; j < keep; ++j) {
    w[j] = std::exp((static_cast<double>(logits[ids[j]]) - logits[ids[0]]) / temperature);
    sum += w[j];
  }
  const double u = rng.uniform() * sum;
  double acc = 0.0;
  for (int j = 0; j < keep; ++j) {
    acc += w[j];
    if (u < acc) return ids[j];
  }
  return ids[keep - 1];  // u within rounding of sum
}

void check_generate_options(const GenerateOptions& o) {
  MOE_CHECK(!o.prompt.empty(), "--prompt is empty: generation starts from at least one token");
  check_value("--tokens", o.tokens);  // ranges: train/value_ranges.cpp
  check_value("--temperature", o.temperature);
  check_value("--top-k", o.top_k);
}

GenerateResult generate(const GenerateOptions& o,
                        const std::function<void(const std::vector<int32_t>&)>& on_prompt,
                        const std::function<void(int32_t)>& on_token) {
  check_generate_options(o);
  const std::shared_ptr<const io::Tokenizer> tok =
      o.tokenizer_impl ? o.tokenizer_impl : std::shared_ptr<const io::Tokenizer>(io::make_tokenizer(o.tokenizer));
  const Device device = o.device;
  require_device(device, "--device");
  select_device(device, 0);
  kernels::ExecContext on_device(device);  // the model, and through it the decoder, live there
  const kernels::ContextScope on(on_device);

  LoadedModel m = load_model_for_inference(o.model_path);
  const model::ModelConfig& c = m.model->config();
  GenerateResult r;
  r.max_position_embeddings = c.max_position_embeddings;
  // A model trained on another tokenizer's ids (a BPE dataset's vocab) would print bytes that
  // mean nothing: refused, not guessed.
  MOE_CHECK(tok->kind() != "bytes" || c.vocab_size == 256, m.source, ": vocab_size ",
            c.vocab_size, " is not the byte-level vocabulary (256): give the tokenizer of its data "
                          "with --tokenizer spm:PATH.model");
  // The tokenizer the model was trained with (issue 42, class 4): another one's ids mean other text.
  const std::string note = io::check_tokenizer_match(c.tokenizer_fingerprint, m.source, tok->fingerprint(),
                                                     str_cat("--tokenizer ", o.tokenizer));
  if (!note.empty()) std::fprintf(stderr, "moetrain: %s\n", note.c_str());
  MOE_CHECK(tok->vocab_size() <= c.vocab_size, "--tokenizer ", o.tokenizer, ": its ", tok->vocab_size(),
            " pieces exceed the model's vocab_size ", c.vocab_size, " (", m.source, ")");
  r.prompt_ids = tok->encode(o.prompt);
  const long long P = static_cast<long long>(r.prompt_ids.size());
  MOE_CHECK(P <= c.max_position_embeddings, "--prompt is ", P, " tokens, longer than "
                                                               "max_position_embeddings ",
            c.max_position_embeddings, " of ", m.source);
  // Refused up front rather than cut short: the output is exactly --tokens long or nothing.
  MOE_CHECK(P + o.tokens <= c.max_position_embeddings, "--prompt (", P, " tokens) + --tokens ",
            o.tokens, " = ", P + o.tokens, " exceeds max_position_embeddings ",
            c.max_position_embeddings, " of ", m.source, ": ask for at most ",
            c.max_position_embeddings - P, " tokens");
  for (long long i = 0; i < P; ++i)
    MOE_CHECK(r.prompt_ids[i] < c.vocab_size, "--prompt: token ", r.prompt_ids[i], " at offset ", i,
              " is outside the model's vocabulary [0, ", c.vocab_size, ") of ", m.source);
  if (on_prompt) on_prompt(r.prompt_ids);
  if (o.tokens == 0) return r;

  model::Decoder dec(*m.model, static_cast<int>(P) + o.tokens);
  Rng rng(o.seed);
  const std::vector<float>* logits = &dec.feed(r.prompt_ids.data(), static_cast<int>(P));
  for (int i = 0; i < o.tokens; ++i) {
    const int32_t next = sample_token(*logits, o.temperature, o.top_k, rng);
    r.new_ids.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 < o.tokens) logits = &dec.feed(&next, 1);
  }
  return r;
}

}  // namespace moe::train
