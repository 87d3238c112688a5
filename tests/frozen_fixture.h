// Small FLUX-stack release files for the tests of the frozen models: the layout a FLUX.1 download
// has (ae.safetensors, text_encoder/ with config.json + model.safetensors, text_encoder_2/ the
// same for T5, tokenizer/ with vocab.json + merges.txt, tokenizer_2/spiece.model), at tiny sizes:
// the autoencoder is the golden one from the reference code (tests/reference/golden/ae_tiny.*),
// T5 and CLIP are seeded random models with vocabularies that cover the golden tokenizers.
#pragma once

#include <string>

namespace flowtrain::test {

struct FrozenRelease {
  std::string autoencoder, t5, t5_tokenizer, clip, clip_tokenizer;
  // The model section's keys for them, as YAML lines under `model:`.
  std::string model_yaml(int64_t t5_max_length) const;
};

// Writes the release under `dir` (the same bytes every time: T5 and CLIP are drawn after
// torch::manual_seed(11), which reseeds the global generator).
FrozenRelease write_frozen_release(const std::string& dir);

}  // namespace flowtrain::test
