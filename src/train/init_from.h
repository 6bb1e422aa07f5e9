// train --init-from FOLDER: a run that starts from a Hugging Face model folder's weights (an
// export, an upcycled model, a model from elsewhere) with a fresh optimizer, schedule and data
// order, on any layout. The folder's config.json is the model's config; the folder is checked in
// the run's setup on every rank (headers only: every tensor there, its shape and dtype, nothing
// extra) before any output is touched, and each rank then reads only the tensors, or for tensor
// parallelism the slices, it holds (train/hf_folder.h), bf16 and fp16 widened to fp32.
#pragma once
#include <string>

#include "model/config.h"
#include "model/model.h"
#include "train/score_bias.h"
#include "train/trainer.h"

namespace moe::train {

// The run's config from --init-from's folder, after checking its weight files against it. A
// --config, --preset or --vocab-size given as well must agree with it field by field: the error
// names the first field that differs, with both values.
model::ModelConfig init_from_config(const ModelOptions& opts);

// This rank's parameters from the folder into `model` (host or device), and, for a noaux_tc
// model whose folder carries e_score_correction_bias tensors, the selection bias into `bias`
// (the trainer hands it to the model: Model::set_score_bias through ScoreBias::apply).
void init_from_folder(const std::string& dir, model::Model& model, ScoreBias& bias);

}  // namespace moe::train
