// Writes everything the independent PyTorch reference (tests/reference/deepseek_ref.py) checks:
// config.json, initial weights, a batch, the C++ logits / losses / every parameter gradient, the
// total losses of 10 AdamW steps and the weights after them (final.safetensors). With topk_method
// noaux_tc, also bias.safetensors: each MoE layer's selection bias before the forward (random,
// so that it changes the routing from the first step) and after the steps, which move it by
// mixture::update_score_bias over each step's loads.
// With "bf16" after the preset, every GEMM runs with bf16 inputs (--precision bf16 on the CPU;
// train.json says "gemm_precision": "bf16", and the reference rounds its GEMM inputs the same way).
// Usage: tool_ref_dump OUT_DIR [preset [bf16]]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "kernels/gemm_bf16_cpu.h"
#include "model/config.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "moe/router.h"
#include "train/optimizer.h"

using namespace moe;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [preset [precision [seq_len]]]\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const std::string preset = argc > 2 ? argv[2] : "test-moe";
    const std::string precision = argc > 3 ? argv[3] : "fp32";
    MOE_CHECK(precision == "fp32" || precision == "bf16", "precision: expected fp32 or bf16, got '", precision, "'");
    if (precision == "bf16" && !kernels::bf16_cpu_available()) {
      std::printf("SKIPPED: bf16 on the CPU: %s\n", kernels::bf16_cpu_unavailable_reason().c_str());
      return 77;
    }
    kernels::ExecContext on_cpu(Device::kCpu, precision == "bf16");
    const kernels::ContextScope on(on_cpu);
    std::filesystem::create_directories(dir);
    // seq_len: 16 by default; a longer one (150) spans several of the CPU attention kernel's
    // 64-row key blocks.
    const int B = 2, T = argc > 4 ? std::stoi(argv[4]) : 16, steps = 10;
    model::ModelConfig cfg = model::preset(preset);
    model::Model m(cfg);
    m.init_weights(42);
    model::save_config(cfg, dir + "/config.json");
    model::save_weights(m, dir + "/model.safetensors");
    // noaux_tc: a random initial bias per MoE layer, uniform in [-0.02, 0.02) (the sigmoid scores
    // of these weights spread over a few hundredths: the bias matters).
    std::vector<int> moe_layers;
    for (int l = 0; l < cfg.num_hidden_layers; ++l)
      if (cfg.aux_free_balancing() && cfg.is_moe_layer(l)) moe_layers.push_back(l);
    const int E = cfg.n_routed_experts;
    std::vector<std::vector<float>> bias(moe_layers.size(), std::vector<float>(E));
    Rng bias_rng(11);
    for (size_t i = 0; i < moe_layers.size(); ++i) {
      for (float& b : bias[i]) b = static_cast<float>((bias_rng.uniform() - 0.5) * 0.04);
      m.set_score_bias(moe_layers[i], bias[i].data());
    }
    auto bias_name = [](int l) { return "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias"; };
    // The writer keeps pointers until write(): the initial values get their own copy.
    const std::vector<std::vector<float>> bias_init = bias;
    io::SafetensorsWriter biasw;
    for (size_t i = 0; i < moe_layers.size(); ++i) biasw.add_f32("init." + bias_name(moe_layers[i]), {E}, bias_init[i].data());

    // lr 1e-3 and eps 1e-5, so that the final weights can be compared at 5e-6: Adam divides each
    // gradient element by its own size, so an element whose gradient is near zero turns fp32
    // round-off (~1e-7 of the tensor's largest gradient) into an O(lr) step, and a larger lr can
    // flip a near-tie in routing. At lr 1e-2 / eps 1e-8 the weights agree only to 2.8e-5
    // (test-moe) and 3.6e-4 (test-moe-seqaux); here to 5.4e-7 and 2.2e-6.
    train::OptimConfig oc;
    oc.lr = 1e-3f;
    oc.min_lr = 1e-4f;
    oc.warmup_steps = 3;
    oc.total_steps = steps;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 0.5f;
    oc.eps = 1e-5f;
    // clang-format off
    nlohmann::json tj = {{"batch", B},         {"seq_len", T},
                         {"steps", steps},     {"lr", oc.lr},
                         {"min_lr", oc.min_lr}, {"warmup_steps", oc.warmup_steps},
                         {"total_steps", oc.total_steps}, {"beta1", oc.beta1},
                         {"beta2", oc.beta2},  {"eps", oc.eps},
                         {"weight_decay", oc.weight_decay}, {"grad_clip", oc.grad_clip},
                         {"gemm_precision", precision},
                         {"mtp_weight", m.mtp_weight()}};
    // clang-format on
    std::ofstream(dir + "/train.json") << tj.dump(2) << "\n";

    Rng rng(7);
    const size_t per = static_cast<size_t>(B) * (T + 1);
    std::vector<int32_t> tokens(per), train_tokens(per * steps);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
    for (auto& t : train_tokens) t = static_cast<int32_t>(rng.below(cfg.vocab_size));
    io::SafetensorsWriter bw;
    bw.add_i32("tokens", {B, T + 1}, tokens.data());
    bw.add_i32("train_tokens", {steps, B, T + 1}, train_tokens.data());
    bw.write(dir + "/batch.safetensors");

    // One forward + backward on `tokens`.
    m.zero_grads();
    model::LossParts lp = m.forward(tokens.data(), B, T);
    std::vector<float> logits(m.logits(), m.logits() + static_cast<size_t>(B) * T * cfg.vocab_size);
    m.backward();
    float loss = static_cast<float>(lp.total), ce = static_cast<float>(lp.ce),
          aux = static_cast<float>(lp.aux), mtp = static_cast<float>(lp.mtp);
    io::SafetensorsWriter ew;
    ew.add_f32("logits", {B, T, cfg.vocab_size}, logits.data());
    ew.add_f32("loss", {1}, &loss);
    ew.add_f32("ce_loss", {1}, &ce);
    ew.add_f32("aux_loss", {1}, &aux);
    if (m.has_mtp()) ew.add_f32("mtp_loss", {1}, &mtp);
    std::vector<float> grads(m.grads(), m.grads() + m.num_params());
    for (const model::ParamSpec& s : m.layout().specs())
      ew.add_f32("grad." + s.name, s.shape, grads.data() + s.offset);

    // 10 AdamW steps from the same initial weights.
    model::Model tm(cfg);
    tm.init_weights(42);
    for (size_t i = 0; i < moe_layers.size(); ++i) tm.set_score_bias(moe_layers[i], bias[i].data());
    train::AdamW opt(tm.layout(), oc);
    std::vector<float> train_losses;
    for (int s = 0; s < steps; ++s) {
      tm.zero_grads();
      train_losses.push_back(static_cast<float>(tm.forward(train_tokens.data() + s * per, B, T).total));
      tm.backward();
      opt.step(tm.params(), tm.grads(), s);
      // The trainer's order: the step's loads move the bias after its update.
      const std::vector<std::vector<int>> loads = tm.expert_loads();
      for (size_t i = 0; i < moe_layers.size(); ++i) {
        std::vector<int64_t> c(loads[i].begin(), loads[i].end());
        mixture::update_score_bias(bias[i].data(), c.data(), E, cfg.bias_update_speed);
        tm.set_score_bias(moe_layers[i], bias[i].data());
      }
    }
    ew.add_f32("train_losses", {steps}, train_losses.data());
    ew.write(dir + "/expected.safetensors");
    // The weights after the 10 steps: the reference compares every tensor, so a drift in the update
    // (decay on the wrong tensors, a wrong bias correction or clip) shows even where the losses agree.
    model::save_weights(tm, dir + "/final.safetensors");
    if (!moe_layers.empty()) {
      std::vector<std::vector<float>> bias_final;
      for (size_t i = 0; i < moe_layers.size(); ++i) bias_final.push_back(tm.score_bias(moe_layers[i]));
      for (size_t i = 0; i < moe_layers.size(); ++i)
        biasw.add_f32("final." + bias_name(moe_layers[i]), {E}, bias_final[i].data());
      biasw.write(dir + "/bias.safetensors");
    }
    std::printf("tool_ref_dump: wrote %s (loss %.6f, ce %.6f, aux %.6f)\n", dir.c_str(), lp.total,
                lp.ce, lp.aux);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tool_ref_dump: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
