// Incremental decoding (model/decoder.h) against the full-sequence forward of model.h, and the
// sampler of train/generate.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/model.h"
#include "train/generate.h"
#include "test_util.h"

using namespace moe;

namespace {

using moe::test_util::error_of;

// max|a - b| / max|b| over one row of V logits.
double rel_error(const float* a, const float* b, int V) {
  double num = 0.0, den = 0.0;
  for (int i = 0; i < V; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// Feeds tokens [0, prompt) at once, then one at a time, and compares the logits of every fed
// position with the full forward's (one sequence of T tokens). Returns the worst error.
double worst_decode_error(const std::string& preset, int T, int prompt, float init_std) {
  model::ModelConfig c = model::preset(preset);
  c.initializer_range = init_std;  // larger weights: sharper logits, a stronger comparison
  model::Model m(c);
  m.init_weights(7);
  // noaux_tc: a random selection bias per MoE layer, large enough to change the choices.
  Rng br(5);
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.aux_free_balancing() && c.is_moe_layer(l)) {
      std::vector<float> b(c.n_routed_experts);
      for (float& x : b) x = static_cast<float>((br.uniform() - 0.5) * 0.2);
      m.set_score_bias(l, b.data());
    }
  Rng r(11);
  std::vector<int32_t> seq(T + 1);
  for (auto& t : seq) t = static_cast<int32_t>(r.below(c.vocab_size));
  m.evaluate(seq.data(), 1, T);
  const int V = c.vocab_size;
  std::vector<float> full(m.logits(), m.logits() + static_cast<size_t>(T) * V);

  model::Decoder dec(m, T);
  double worst = 0.0;
  const std::vector<float>& first = dec.feed(seq.data(), prompt);
  EXPECT_EQ(dec.position(), prompt);
  worst = std::max(worst, rel_error(first.data(), full.data() + static_cast<size_t>(prompt - 1) * V, V));
  for (int p = prompt; p < T; ++p) {
    const std::vector<float>& l = dec.feed(&seq[p], 1);
    const double e = rel_error(l.data(), full.data() + static_cast<size_t>(p) * V, V);
    EXPECT_LE(e, 1e-5) << preset << " position " << p;
    worst = std::max(worst, e);
  }
  EXPECT_EQ(dec.position(), T);
  return worst;
}

}  // namespace

TEST(Decoder, IncrementalLogitsEqualTheFullForward) {
  // MoE (1 dense + 2 MoE layers, shared expert, batch aux), the other router branches (incl.
  // DeepSeek-V2 group-limited routing), dense only.
  // DeepSeek-V2/V3's latent cache; the other families: GQA's cache of kv heads, q/k/v biases,
  // QK-norm, the gated shared expert.
  for (const std::string preset : {"test-moe", "test-moe-seqaux", "test-moe-v2group", "test-dense",
                                   "test-mla", "test-mla-noq", "test-v3", "test-moe-group",
                                   "test-mixtral", "test-qwen2moe", "test-qwen3moe"}) {
    const double worst = worst_decode_error(preset, 24, 7, 0.2f);
    EXPECT_LE(worst, 1e-5) << preset;
    std::printf("%s: worst max|decode - full| / max|full| over 24 positions: %.2e\n",
                preset.c_str(), worst);
  }
}

// Multi-head latent attention caches kv_lora_rank + qk_rope_head_dim floats per token and layer
// (test-mla: 16 + 4 = 20), not the 2·nh·head width of K and V.
TEST(Decoder, LatentCacheHoldsTheCompressedLatentOnly) {
  for (const char* preset : {"test-mla", "test-moe"}) {
    model::ModelConfig c = model::preset(preset);
    model::Model m(c);
    model::Decoder dec(m, 40);
    const size_t per_token = c.uses_mla() ? c.kv_lora_rank + c.qk_rope_head_dim : 2 * c.hidden_size;
    EXPECT_EQ(dec.cache_bytes(), sizeof(float) * c.num_hidden_layers * 40 * per_token) << preset;
  }
}

TEST(Decoder, OneTokenPromptAndPrefillOfEverything) {
  EXPECT_LE(worst_decode_error("test-mla", 16, 1, 0.2f), 1e-5);   // MLA: every position by a step
  EXPECT_LE(worst_decode_error("test-moe", 16, 1, 0.2f), 1e-5);   // every position by a step
  EXPECT_LE(worst_decode_error("test-moe", 16, 16, 0.2f), 1e-5);  // the whole sequence at once
}

TEST(Decoder, RefusesToOverflowTheCacheAndSecondPrefills) {
  model::ModelConfig c = model::preset("test-moe");
  model::Model m(c);
  m.init_weights(1);
  EXPECT_NE(error_of([&] { model::Decoder(m, c.max_position_embeddings + 1); })
                .find("max_position_embeddings = 256"),
            std::string::npos);
  model::Decoder dec(m, 4);
  const int32_t toks[5] = {1, 2, 3, 4, 5};
  dec.feed(toks, 3);
  EXPECT_NE(error_of([&] { dec.feed(toks, 2); }).find("only the first call"), std::string::npos);
  dec.feed(toks, 1);
  EXPECT_NE(error_of([&] { dec.feed(toks, 1); }).find("beyond the cache of 4 positions"),
            std::string::npos);
  const int32_t bad = c.vocab_size;
  dec.reset();
  EXPECT_NE(error_of([&] { dec.feed(&bad, 1); }).find("outside the vocabulary"), std::string::npos);
}

TEST(Sampler, GreedyTopKAndSeeds) {
  Rng rng(0);
  const std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f, 1.9f};
  EXPECT_EQ(train::sample_token(l, 0.0f, 0, rng), 1);                               // argmax, the lower id on a tie
  for (int i = 0; i < 50; ++i) EXPECT_EQ(train::sample_token(l, 5.0f, 1, rng), 1);  // top-1 = greedy
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(train::sample_token(l, 100.0f, 3, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2, 4}));  // only the top 3, each drawn at this temperature
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(train::sample_token(l, 100.0f, 0, rng));
  EXPECT_EQ(seen.size(), 5u);
  // Frequencies follow softmax(l / T): at T = 1, P(id 3) = e^-1 / Σ e^l ≈ 0.0157.
  Rng a(42);
  int n3 = 0;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) n3 += train::sample_token(l, 1.0f, 0, a) == 3;
  double z = 0.0;
  for (float x : l) z += std::exp(x);
  EXPECT_NEAR(n3 / static_cast<double>(draws), std::exp(-1.0) / z, 0.004);
  Rng s1(9), s2(9);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(train::sample_token(l, 1.0f, 0, s1), train::sample_token(l, 1.0f, 0, s2));
  const std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_NE(error_of([&] { train::sample_token(nan, 1.0f, 0, rng); }).find("logit of token 1"),
            std::string::npos);
}

TEST(Tokenizer, BytesRoundTrip) {
  io::ByteTokenizer t;
  const std::string s = std::string("In the beginning\n\xff", 18);
  const std::vector<int32_t> ids = t.encode(s);
  ASSERT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids.back(), 255);
  std::string back;
  for (int32_t id : ids) back += t.decode_token(id);
  EXPECT_EQ(back, s);
  EXPECT_EQ(t.decode_token(300), "<|300|>");
  EXPECT_NE(error_of([] { io::make_tokenizer("spm"); }).find("tokenizer 'spm'"), std::string::npos);
}
