// `moetrain inspect PATH`: prints what a file or folder holds, recognised by its shape:
//   a checkpoint step-N/ folder (manifest.json), a folder of checkpoints (step-N/ inside),
//   an export or run output folder (config.json + model*.safetensors), one .safetensors file,
//   a config.json, a Megatron indexed dataset (PREFIX, PREFIX.idx or PREFIX.bin), or any other
//   regular file as the byte corpus `train --data` would read.
// Printed: config, step, parallel layout, tensors with dtypes and shapes (routed experts of a
// layer folded into one line), parameter counts (total and active per token, from the config's
// own counting function, checked against the tensors), tokens and documents.
#pragma once
#include <string>

namespace moe::report {

// The text inspect prints for path (throws moe::Error naming path when it is not recognised).
std::string inspect(const std::string& path);

}  // namespace moe::report
