// Aux-loss-free balancing state. See score_bias.h.
#include "train/score_bias.h"

#include <cmath>

#include "core/error.h"
#include "io/json_file.h"
#include "model/weights_io.h"
#include "moe/router.h"
#include "train/value_ranges.h"

namespace moe::train {

ScoreBias::ScoreBias(const model::ModelConfig& cfg, std::optional<float> rate_flag)
    : cfg_(cfg), rate_(rate_flag ? *rate_flag : cfg.bias_update_speed) {
  if (rate_flag) {
    check_value("--balance.bias-rate", *rate_flag);
    MOE_CHECK(cfg.aux_free_balancing(), "--balance.bias-rate ", *rate_flag,
              ": the model's router uses topk_method \"", cfg.topk_method,
              "\" (the bias rate is for noaux_tc, aux-loss-free balancing)");
  }
  if (!cfg.aux_free_balancing()) return;
  E_ = cfg.n_routed_experts;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.is_moe_layer(l)) layers_.push_back(l);
  bias_.assign(layers_.size() * E_, 0.0f);
}

void ScoreBias::update(const std::vector<int64_t>& loads_LE) {
  if (!active()) return;
  MOE_CHECK(loads_LE.size() == bias_.size(), "internal: ", loads_LE.size(),
            " expert loads for the selection bias of ", layers_.size(), " MoE layers x ", E_,
            " experts");
  for (size_t i = 0; i < layers_.size(); ++i)
    mixture::update_score_bias(bias_.data() + i * E_, loads_LE.data() + i * E_, E_, rate_);
}

void ScoreBias::apply(model::Model& m) const {
  const int first = m.stage().first_layer, end = m.stage().end_layer(m.config());
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i] >= first && layers_[i] < end) m.set_score_bias(layers_[i], layer(static_cast<int>(i)));
}

nlohmann::json ScoreBias::to_json() const {
  if (!active()) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < layers_.size(); ++i) {
    // float -> double is exact, and the JSON writer prints the shortest double that reads back.
    std::vector<double> row(layer(static_cast<int>(i)), layer(static_cast<int>(i)) + E_);
    j[std::to_string(layers_[i])] = row;
  }
  return j;
}

void ScoreBias::load_json(const nlohmann::json& j, const std::string& where) {
  if (!active()) return;
  MOE_CHECK(j.is_object(), where, " must be an object {\"<layer>\": [", E_,
            " numbers]} (the noaux_tc routers' e_score_correction_bias), got ",
            j.is_null() ? std::string("nothing") : j.type_name());
  MOE_CHECK(j.size() == layers_.size(), where, " has ", j.size(), " layers, the model has ",
            layers_.size(), " MoE layers");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string key = std::to_string(layers_[i]);
    auto it = j.find(key);
    MOE_CHECK(it != j.end(), where, ": no entry for MoE layer ", key);
    MOE_CHECK(it->is_array() && it->size() == static_cast<size_t>(E_), where, "[\"", key,
              "\"] must be an array of ", E_, " numbers");
    for (int e = 0; e < E_; ++e) {
      const nlohmann::json& v = (*it)[e];
      MOE_CHECK(v.is_number() && std::isfinite(v.get<double>()) &&
                    std::abs(v.get<double>()) <= 3.4e38,
                where, "[\"", key, "\"][", e, "] = ", io::excerpt(v), " is not a finite float");
      check_value("router_bias value", v.get<double>(), str_cat(where, "[\"", key, "\"][", e, "]"));
      bias_[i * E_ + e] = static_cast<float>(v.get<double>());
    }
  }
}

void ScoreBias::add_tensors(io::SafetensorsWriter& w) const {
  for (size_t i = 0; i < layers_.size(); ++i)
    w.add_f32(model::score_bias_name(layers_[i]), {E_}, bias_.data() + i * E_);
}

void ScoreBias::load_tensors(const std::function<bool(const std::string&, float*)>& read,
                             const std::string& where) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string name = model::score_bias_name(layers_[i]);
    MOE_CHECK(read(name, bias_.data() + i * E_), where, ": tensor \"", name,
              "\" is missing (the noaux_tc router's selection bias: without it the model routes differently than it "
              "trained)");
    for (int e = 0; e < E_; ++e)
      check_value("router_bias value", bias_[i * E_ + e], str_cat(where, ": ", name, "[", e, "]"));
  }
}

}  // namespace moe::train
