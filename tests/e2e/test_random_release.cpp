// flowtrain_random_release (bench/random_release.cpp) and the GPU check's FLUX.1-width step with
// online encoders (configs/bench/flux_width_online.yaml), at small sizes on the CPU: the files it
// writes are a release the frozen-model loaders read as they read FLUX.1's, and the config's
// step trains on them with the encoders in the step — so the GPU check's step can only fail there
// for reasons of the GPU or the size.
#include "cli_runner.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain::test;

TEST(RandomRelease, ASmallReleaseLoadsAndTheOnlineFluxWidthConfigTrainsOnIt) {
  const std::string dir = scratch_dir("random_release");
  const std::string release = dir + "/release";
  const std::string tool = std::string(FLOWTRAIN_RANDOM_RELEASE_BINARY) + " --out " + release + " --size small" +
                           " --t5-tokenizer " + source_path("tests/reference/golden/t5_spiece.model") +
                           " --clip-tokenizer " + source_path("tests/reference/golden/clip_tokenizer_small") +
                           " 2>&1";
  ASSERT_EQ(std::system(tool.c_str()), 0) << tool;
  for (const char* f : {"ae.safetensors", "text_encoder/config.json", "text_encoder/model.safetensors",
                        "text_encoder_2/config.json", "text_encoder_2/model.safetensors", "tokenizer/vocab.json",
                        "tokenizer/merges.txt", "tokenizer_2/spiece.model"})
    EXPECT_TRUE(fs::exists(release + "/" + f)) << f;

  // The config as the GPU check runs it, narrowed to the CPU: the small release's widths (T5 and
  // CLIP 64), a tiny transformer, 64² images (8² latents), 32 text tokens.
  const std::string json = dir + "/bench.json";
  const auto r = run_flowtrain(
      "bench -c " + source_path("configs/bench/flux_width_online.yaml") + " --synthetic --steps 2 --warmup 1" +
      " --set model.autoencoder=" + release + "/ae.safetensors --set model.text_encoders.t5=" + release +
      "/text_encoder_2 --set model.text_encoders.t5_tokenizer=" + release +
      "/tokenizer_2/spiece.model --set model.text_encoders.clip=" + release +
      "/text_encoder --set model.text_encoders.clip_tokenizer=" + release +
      "/tokenizer --set model.size=flux-tiny --set model.depth=1 --set model.depth_single=1"
      " --set model.context_dim=64 --set model.vec_dim=64 --set model.image_size=8 --set model.text_len=32"
      " --set model.text_encoders.t5_max_length=32 --set train.precision=fp32 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto report = nlohmann::json::parse(read_file(json));
  EXPECT_TRUE(std::isfinite(report["first_loss"].get<double>())) << report.dump(2);
  EXPECT_GT(report["encode_median_s"].get<double>(), 0.0) << "the frozen encoders ran in the step";
  EXPECT_GT(report["estimated_peak_bytes"].get<int64_t>(), 0);
}
