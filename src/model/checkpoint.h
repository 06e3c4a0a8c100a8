#pragma once
// Loading Hugging Face Qwen3.5 checkpoint directories as published (config.json + safetensors), with no
// conversion step. Large matrices become zero-copy views of the mapped files; names, prefixes, expert layouts
// and FP8 handling are described in docs/checkpoints.md.

#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"

namespace moeserve {

class TensorSet;

struct Checkpoint {
  ModelWeights weights;
  // Every tensor of the checkpoint; the weights' views point into it (it is also held in weights.storage).
  std::shared_ptr<const TensorSet> tensors;
  // Tensors the text model does not read, by name. The MTP layer is in weights.mtp when its tensors are
  // complete; otherwise mtp_problem says what is wrong with them.
  std::vector<std::string> mtp_tensors;     // mtp.*
  std::string mtp_problem;
  std::vector<std::string> vision_tensors;  // model.visual.*
};

// Reads DIR/config.json (and generation_config.json for the eos ids when config.json has none) and the
// safetensors. Throws moeserve::Error; when tensors and config disagree, one error lists every missing,
// unexpected, mis-shaped and mis-typed tensor by name.
Checkpoint open_checkpoint(const std::string& dir);
ModelWeights load_checkpoint(const std::string& dir);

// The same assembly over tensors already in memory (used by make_dummy_weights); `where` names them in
// errors.
Checkpoint assemble_checkpoint(ModelConfig config, std::shared_ptr<const TensorSet> tensors,
                               const std::string& where);

}  // namespace moeserve
