// The Flux family's keys of the `model:` section (besides ModelConfig's own): read as
// model.family<FluxConfig>(), declared to the schema by flux_family() (flux_family.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::trainer::families {

struct FluxConfig {
  int64_t depth_single = 0;         // single-stream blocks; 0 = from size
  int64_t context_dim = 0;          // text token embedding width; 0 = from size
  int64_t vec_dim = 0;              // pooled text vector width; 0 = from size
  std::string axes_dim;             // RoPE channels per id axis, "16,56,56"; "" = from size
  double theta = 10000.0;           // RoPE base
  int64_t text_len = 512;           // text tokens per sample
  double text_dropout = 0.1;        // probability each text input is zeroed (SD3-style)
  int64_t text_encoder_layers = 0;  // built-in text encoder layers; 0 = precomputed embeddings
  int64_t text_encoder_heads = 4;   // built-in text encoder heads
  int64_t vocab_size = 256;         // built-in text encoder token ids
  int64_t patch_t = 1;              // video (model.frames > 1): frames per token; must divide frames
  double guidance = 3.5;            // flux-dev (guidance embedding): g in training and sampling
};

}  // namespace flowtrain::trainer::families
