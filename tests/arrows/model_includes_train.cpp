// Forbidden: arrows point down, never up: the model does not know the trainer. tests/arrows.sh
// expects this file to fail to compile against moetrain_model.
#include "train/trainer.h"
