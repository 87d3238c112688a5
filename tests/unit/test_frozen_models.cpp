// The frozen models built from release files as they are (trainer/frozen/frozen_models.h): the
// sizes come from the files (config.json, the autoencoder's tensor shapes and metadata), the
// outputs equal the references' golden ones, and `flowtrain export --component` writes the same
// tensors back under the same names.
#include "trainer/frozen/frozen_models.h"

#include "data/safetensors.h"
#include "cli_runner.h"
#include "reference_golden.h"
#include "test_util.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace flowtrain {
namespace {
namespace fs = std::filesystem;

// The golden tiny model as a release folder holds it: config.json + model.safetensors.
std::string release_folder(const std::string& name, const std::string& weights, const std::string& config) {
  const std::string dir = test::scratch_dir(name);
  fs::copy_file(test::golden_path(weights), dir + "/model.safetensors", fs::copy_options::overwrite_existing);
  fs::copy_file(test::golden_path(config), dir + "/config.json", fs::copy_options::overwrite_existing);
  return dir;
}

// The reference's outputs, as test_t5.cpp / test_clip.cpp / test_autoencoder.cpp compare them:
// 1e-5 relative is fp32 summation-order noise through two small layers (see those tests).
constexpr double kTolerance = 1e-5;

TEST(FrozenModels, ReleaseFoldersLoadWithTheirOwnSizesAndGiveTheReferencesOutputs) {
  models::T5Encoder t5 = trainer::load_t5(release_folder("frozen_t5", "t5_tiny.safetensors", "t5_tiny_config.json"));
  EXPECT_EQ(t5->options.d_model, 32);
  EXPECT_EQ(t5->options.num_layers, 2);
  EXPECT_EQ(t5->options.vocab_size, 64);
  for (const auto& p : t5->parameters()) EXPECT_FALSE(p.requires_grad());
  const data::SafetensorsReader t5_io(test::golden_path("t5_tiny_io.safetensors"));
  EXPECT_LT(test::relative_max_error(t5->forward(t5_io.get("ids")), t5_io.get("hidden")), kTolerance);

  models::ClipTextEncoder clip =
      trainer::load_clip(release_folder("frozen_clip", "clip_tiny.safetensors", "clip_tiny_config.json"));
  EXPECT_EQ(clip->options.max_positions, 16);
  EXPECT_EQ(clip->options.eos_token_id, 2);
  const data::SafetensorsReader clip_io(test::golden_path("clip_tiny_io.safetensors"));
  const models::ClipTextOutput out = clip->forward(clip_io.get("ids"));
  EXPECT_LT(test::relative_max_error(out.hidden, clip_io.get("hidden")), kTolerance);
  EXPECT_LT(test::relative_max_error(out.pooled, clip_io.get("pooled")), kTolerance);

  // The autoencoder's architecture from its tensors, its norm groups and factors from metadata.
  models::Autoencoder ae = trainer::load_autoencoder(test::golden_path("ae_tiny.safetensors"));
  EXPECT_EQ(ae->options.ch, 8);
  EXPECT_EQ(ae->options.ch_mult, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ae->options.num_res_blocks, 1);
  EXPECT_EQ(ae->options.z_channels, 4);
  EXPECT_EQ(ae->options.norm_groups, 4);
  const data::SafetensorsReader ae_io(test::golden_path("ae_tiny_io.safetensors"));
  EXPECT_LT(test::relative_max_error(ae->encode(ae_io.get("x")), ae_io.get("z")), kTolerance);
  EXPECT_LT(test::relative_max_error(ae->decode(ae_io.get("z")), ae_io.get("decoded")), kTolerance);
}

// Every tensor of `original` is in `written` under its name, bit for bit, and nothing else is.
void expect_same_tensors(const std::string& original, const std::string& written) {
  const data::SafetensorsReader a(original), b(written);
  EXPECT_EQ(std::set<std::string>(a.keys().begin(), a.keys().end()), std::set<std::string>(b.keys().begin(), b.keys().end()))
      << original << " vs " << written;
  for (const std::string& key : a.keys())
    if (b.contains(key)) {
      EXPECT_TRUE(at::equal(a.get(key), b.get(key))) << key;
    }
}

TEST(FrozenModels, ExportWritesTheReleaseFilesBack) {
  const std::string dir = test::scratch_dir("frozen_export");
  const std::string t5 = release_folder("frozen_export_t5", "t5_tiny.safetensors", "t5_tiny_config.json");
  const std::string clip = release_folder("frozen_export_clip", "clip_tiny.safetensors", "clip_tiny_config.json");
  trainer::export_component(trainer::FrozenComponent::t5, t5, dir + "/t5.safetensors");
  expect_same_tensors(t5 + "/model.safetensors", dir + "/t5.safetensors");
  trainer::export_component(trainer::FrozenComponent::clip, clip, dir + "/clip.safetensors");
  expect_same_tensors(clip + "/model.safetensors", dir + "/clip.safetensors");
  trainer::export_component(trainer::FrozenComponent::autoencoder, test::golden_path("ae_tiny.safetensors"),
                            dir + "/ae.safetensors");
  expect_same_tensors(test::golden_path("ae_tiny.safetensors"), dir + "/ae.safetensors");
  // The written autoencoder carries what its tensors cannot say, so it loads as it was.
  EXPECT_EQ(trainer::autoencoder_options_of_file(dir + "/ae.safetensors").norm_groups, 4);
  // Through the CLI, in bf16: the same names, the values rounded.
  const auto r = test::run_flowtrain("export --component autoencoder --from " + test::golden_path("ae_tiny.safetensors") +
                                     " --out " + dir + "/ae_bf16.safetensors --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const data::SafetensorsReader bf16(dir + "/ae_bf16.safetensors");
  EXPECT_EQ(bf16.get("encoder.conv_in.weight").scalar_type(), at::kBFloat16);
}

TEST(FrozenModels, AFileOrFolderThatIsNotAReleaseIsOneErrorNamingIt) {
  const std::string dir = test::scratch_dir("frozen_bad");
  fs::create_directories(dir + "/relu_t5");
  std::ofstream(dir + "/relu_t5/config.json") << R"({"feed_forward_proj": "relu", "vocab_size": 8})";
  std::ofstream(dir + "/relu_t5/model.safetensors") << "x";
  fs::create_directories(dir + "/empty");
  std::ofstream(dir + "/empty/config.json") << "{}";
  data::write_safetensors(dir + "/not_ae.safetensors", {{"weight", at::zeros({2})}});
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { trainer::load_t5(dir + "/relu_t5"); }, dir + "/relu_t5/config.json"},
      {[&] { trainer::load_clip(dir + "/empty"); }, dir + "/empty"},
      {[&] { trainer::load_autoencoder(dir + "/not_ae.safetensors"); }, dir + "/not_ae.safetensors"},
      {[&] { trainer::load_t5(dir + "/absent"); }, dir + "/absent"},
  };
  for (const auto& [load, named] : cases) {
    try {
      load();
      ADD_FAILURE() << "loaded " << named;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace flowtrain
