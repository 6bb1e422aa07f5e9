// `moetrain generate MODEL --prompt TEXT`: text from a trained model. MODEL is a checkpoint folder
// (step-N, or a folder of them: the newest complete one) or an exported Hugging Face folder
// (config.json + model.safetensors or shards with model.safetensors.index.json). The prompt is
// encoded (io/tokenizer.h: bytes), fed once (prefill), then one token per step through the KV
// cache of model/decoder.h; each token is sampled on the host from the last logits.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/tokenizer.h"
#include "model/model.h"

namespace moe::train {

struct GenerateOptions {
  std::string model_path;
  std::string prompt;
  int tokens = 200;          // new tokens; prompt + tokens must fit max_position_embeddings
  float temperature = 0.8f;  // 0 = greedy (argmax, the lowest id on a tie)
  int top_k = 0;             // sample among the k most likely tokens; 0 = all
  uint64_t seed = 0;         // the sampler's Rng (core/rng.h)
  Device device = Device::kCpu;
  std::string tokenizer = "bytes";  // bytes | spm:PATH (loaded by the CLI into tokenizer_impl)
  // The tokenizer itself when the caller made one (a SentencePiece model); else `tokenizer` names it.
  std::shared_ptr<const io::Tokenizer> tokenizer_impl;
};

// A model read for inference, on the active device. Errors (missing folder, bad manifest,
// checksum, shapes, non-finite weights, a weight file of another config) name the file and tensor;
// `source` is the file the config came from.
// Every file of an exported folder (config.json, model.safetensors, the index and its shards) is
// read as a checkpoint's shards are (io/data_file.h): a plain file inside the folder, never a
// symbolic link followed out of it, names from the index plain file names, sizes on the descriptor.
struct LoadedModel {
  std::unique_ptr<model::Model> model;
  std::string source;
  std::string folder;  // the checkpoint or export folder the weights came from (the run's input)
};
LoadedModel load_model_for_inference(const std::string& path);

// The next token from logits [V]: greedy when temperature == 0, else softmax(logits / temperature)
// over the top_k largest (all when 0; ties in the cut go to the lower id), drawn with one
// rng.uniform(). A non-finite logit is an error (naming the id).
int32_t sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng);

// Checks the options and the lengths (one error line naming the flag or the limit), then
// generates; on_token receives each new token as soon as it is chosen. Returns the new tokens.
struct GenerateResult {
  std::vector<int32_t> prompt_ids, new_ids;
  int max_position_embeddings = 0;
};
void check_generate_options(const GenerateOptions& o);
GenerateResult generate(const GenerateOptions& o,
                        const std::function<void(const std::vector<int32_t>& prompt)>& on_prompt,
                        const std::function<void(int32_t)>& on_token);

}  // namespace moe::train
