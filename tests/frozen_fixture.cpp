#include "frozen_fixture.h"

#include "models/clip/clip.h"
#include "models/t5/t5.h"
#include "reference_golden.h"
#include "trainer/frozen/release_files.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace flowtrain::test {
namespace fs = std::filesystem;

std::string FrozenRelease::model_yaml(int64_t t5_max_length) const {
  return "  autoencoder: " + autoencoder + "\n  text_encoders:\n    t5: " + t5 + "\n    t5_tokenizer: " + t5_tokenizer +
         "\n    t5_max_length: " + std::to_string(t5_max_length) + "\n    clip: " + clip +
         "\n    clip_tokenizer: " + clip_tokenizer + "\n";
}

FrozenRelease write_frozen_release(const std::string& dir) {
  FrozenRelease r{dir + "/ae.safetensors", dir + "/text_encoder_2", dir + "/tokenizer_2/spiece.model",
                  dir + "/text_encoder", dir + "/tokenizer"};
  for (const auto& sub : {"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"}) fs::create_directories(dir + "/" + sub);
  fs::copy_file(golden_path("ae_tiny.safetensors"), r.autoencoder, fs::copy_options::overwrite_existing);
  fs::copy_file(golden_path("t5_spiece.model"), r.t5_tokenizer, fs::copy_options::overwrite_existing);
  for (const auto& f : {"vocab.json", "merges.txt"})
    fs::copy_file(golden_path(std::string("clip_tokenizer_small/") + f), r.clip_tokenizer + "/" + f,
                  fs::copy_options::overwrite_existing);

  torch::manual_seed(11);
  models::T5Options t5;
  t5.vocab_size = 512;  // covers t5_spiece.model's ids
  t5.d_model = 32, t5.d_kv = 8, t5.d_ff = 48, t5.num_layers = 2, t5.num_heads = 4;
  trainer::write_t5_folder(*models::T5Encoder(t5), r.t5);

  models::ClipTextOptions clip;
  clip.vocab_size = 2514;  // clip_tokenizer_small's ids
  clip.hidden = 32, clip.intermediate = 48, clip.layers = 2, clip.heads = 4, clip.max_positions = 77;
  trainer::write_clip_folder(*models::ClipTextEncoder(clip), r.clip);
  return r;
}

}  // namespace flowtrain::test
