// Allowed: the planner reads model configs (plan -> model_config). The control for tests/arrows.sh:
// the same kind of target compiles when the arrow exists.
#include "model/config.h"
#include "moe/layout.h"
#include "parallel/schedule.h"

int arrows_allowed_probe() { return moe::model::ModelConfig{}.hidden_size > 0 ? 1 : 0; }
