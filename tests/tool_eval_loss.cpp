// Loads a checkpoint (any layout) into one whole model, evaluates the loss of a fixed random batch,
// and writes the batch and that loss, for tests/reference/eval_hf.py to recompute in PyTorch from
// the exported Hugging Face folder. Usage: tool_eval_loss CHECKPOINT OUT.safetensors
#include <cstdio>

#include "core/rng.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "train/checkpoint.h"

using namespace moe;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT OUT.safetensors\n", argv[0]);
    return 2;
  }
  try {
    train::CheckpointMeta meta = train::read_checkpoint_meta(argv[1]);
    model::ModelConfig cfg = model::config_from_json(meta.config, argv[1]);
    model::Model m(cfg);
    train::load_checkpoint_tensors(argv[1], m.layout(), m.params(), nullptr, nullptr);
    const int B = 2, T = 16;
    Rng rng(99);
    std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
    model::LossParts lp = m.evaluate(tokens.data(), B, T);
    float loss = static_cast<float>(lp.total);
    io::SafetensorsWriter w;
    w.add_i32("tokens", {B, T + 1}, tokens.data());
    w.add_f32("loss", {1}, &loss);
    w.write(argv[2]);
    std::printf("tool_eval_loss: loss %.7f\n", lp.total);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tool_eval_loss: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
