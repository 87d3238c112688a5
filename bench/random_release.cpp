// flowtrain_random_release --out DIR [--size flux1|small] [--dtype bf16|fp32] --t5-tokenizer spiece.model
//                          --clip-tokenizer DIR
//
// Writes a FLUX.1 release's frozen models as a download lays them out — DIR/ae.safetensors,
// DIR/text_encoder/ (CLIP-L), DIR/text_encoder_2/ (T5-XXL), DIR/tokenizer/ (vocab.json +
// merges.txt), DIR/tokenizer_2/spiece.model — with random weights (seeded: the same bytes every
// run) at FLUX.1's sizes (AE 83.8M, T5-XXL 4.76B, CLIP-L 123M parameters; flux1) or small ones
// (a quick check of the same path on the CPU). The tokenizers are copied from the given files:
// any whose ids fit the models' vocabularies (the tests' golden ones do). For measuring the
// training step with online encoders where the official files cannot be fetched
// (scripts/gpu_check.sh); the weights mean nothing, so what it trains is only timed and sized.
#include "models/autoencoder/autoencoder.h"
#include "models/clip/clip.h"
#include "models/t5/t5.h"
#include "trainer/frozen/release_files.h"

#include <CLI/CLI.hpp>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain;

namespace {

struct Sizes {
  models::AutoencoderOptions ae;
  models::T5Options t5;
  models::ClipTextOptions clip;
};

Sizes sizes_of(const std::string& name) {
  Sizes s{models::flux_autoencoder_options(), models::t5_xxl_options(), models::clip_l_text_options()};
  if (name == "small") {  // the same vocabularies (so the same tokenizers fit), narrow and shallow
    s.ae.ch = 32;
    s.t5.d_model = 64, s.t5.d_kv = 16, s.t5.d_ff = 128, s.t5.num_layers = 2, s.t5.num_heads = 4;
    s.clip.hidden = 64, s.clip.intermediate = 128, s.clip.layers = 2, s.clip.heads = 4;
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a FLUX.1 release's frozen model files with random weights (AE, T5-XXL, CLIP-L)"};
  std::string out, size = "flux1", dtype_name = "bf16", t5_tokenizer, clip_tokenizer;
  app.add_option("--out", out, "release folder to write")->required();
  app.add_option("--size", size, "flux1 (the release's sizes) | small")
      ->check(CLI::IsMember({"flux1", "small"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype_name, "bf16 (as the release) | fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--t5-tokenizer", t5_tokenizer, "a SentencePiece model to copy as tokenizer_2/spiece.model")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--clip-tokenizer", clip_tokenizer, "a folder with vocab.json + merges.txt to copy as tokenizer/")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  try {
    const Sizes s = sizes_of(size);
    const at::ScalarType dtype = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    fs::create_directories(fs::path(out) / "tokenizer");
    fs::create_directories(fs::path(out) / "tokenizer_2");
    fs::copy_file(t5_tokenizer, fs::path(out) / "tokenizer_2" / "spiece.model", fs::copy_options::overwrite_existing);
    for (const char* f : {"vocab.json", "merges.txt"})
      fs::copy_file(fs::path(clip_tokenizer) / f, fs::path(out) / "tokenizer" / f, fs::copy_options::overwrite_existing);

    torch::manual_seed(0);
    auto t0 = std::chrono::steady_clock::now();
    trainer::write_autoencoder_file(*models::Autoencoder(s.ae), (fs::path(out) / "ae.safetensors").string(), dtype);
    std::printf("ae.safetensors: %.1fM parameters, %.1f s\n", models::autoencoder_parameter_count(s.ae) / 1e6,
                seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    trainer::write_clip_folder(*models::ClipTextEncoder(s.clip), (fs::path(out) / "text_encoder").string(), dtype);
    std::printf("text_encoder/ (CLIP): %.1fM parameters, %.1f s\n", models::clip_text_parameter_count(s.clip) / 1e6,
                seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    trainer::write_t5_folder(*models::T5Encoder(s.t5), (fs::path(out) / "text_encoder_2").string(), dtype);
    std::printf("text_encoder_2/ (T5): %.1fM parameters, %.1f s\n", models::t5_encoder_parameter_count(s.t5) / 1e6,
                seconds_since(t0));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flowtrain_random_release: %s\n", e.what());
    return 1;
  }
  return 0;
}
