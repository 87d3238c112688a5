// `flowtrain export`: a checkpoint's weights as one inference safetensors file with the reference
// key names (loads into facebookresearch/DiT's `DiT_models[...]` with load_state_dict).
#pragma once

#include <string>
#include <vector>

namespace flowtrain::trainer {

struct ExportOptions {
  std::string checkpoint_dir;
  std::string out_path;
  bool ema = false;            // export the EMA weights instead of the raw ones
  std::string dtype = "fp32";  // fp32 | bf16
  // A model with a built-in text encoder: the encoder's weights go here (required for such a
  // checkpoint), out_path gets the transformer alone (trainer/family.h exported_parts).
  std::string text_encoder_out;
};

// Writes the file(s) atomically; returns the exported key names of out_path in order.
std::vector<std::string> export_checkpoint(const ExportOptions& options);

}  // namespace flowtrain::trainer
