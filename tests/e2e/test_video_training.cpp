// Video end to end through the CLI: `data make-moving-fashion` writes shards with the evaluation
// prompts, their real clips and a tokenizer beside them; the Flux MMDiT over 3-D ids trains on the
// clips with the built-in text path and writes a frame-strip grid plus one MP4 per sample; a
// model/data frame mismatch is one error naming both keys.
#include "cli_runner.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "data/video.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

// One set for the binary: 24 clips of 8 frames in 2 shards, 6 evaluation prompts.
const std::string& video_data() {
  static const std::string dir = [] {
    const std::string d = scratch_dir("video_data") + "/mf";
    auto r = run_flowtrain("data make-moving-fashion --fashion-mnist " + fashion_mnist_dir() + " --out " + d +
                           " --num 24 --frames 8 --max-count 12 --num-eval 6");
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return d;
  }();
  return dir;
}

CommandResult train_video(const std::string& out_dir, const std::vector<std::string>& sets = {}) {
  std::string args = "train -c " + source_path("tests/configs/tiny_video.yaml") + " --set run.out_dir=" + out_dir +
                     " --set data.path=" + video_data() + " --set data.shards=" + video_data() +
                     "/train-{000000..000001}.tar";
  for (const auto& s : sets) args += " --set " + s;
  return run_flowtrain(args);
}

}  // namespace

TEST(VideoData, MovingFashionWritesEvaluationPromptsClipsAndATokenizer) {
  REQUIRE_DATA();
  const std::string dir = video_data();
  std::ifstream prompts(dir + "/eval_prompts.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(prompts, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 6u);
  for (const auto& row : rows) {
    const std::string caption = row.at("caption");
    EXPECT_NE(caption.find(row.at("color").get<std::string>() + " " + row.at("class").get<std::string>() + " moving " +
                           row.at("direction").get<std::string>()),
              std::string::npos)
        << caption;
  }
  const flowtrain::data::SafetensorsReader clips(dir + "/eval_clips.safetensors");
  ASSERT_EQ(clips.get("clips").sizes(), at::IntArrayRef({6, 8, 3, 32, 32}));
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.model"));
  EXPECT_TRUE(fs::exists(dir + "/eval_prompts.txt"));
  const auto manifest = nlohmann::json::parse(read_file(dir + "/manifest.json"));
  EXPECT_EQ(manifest.at("frames").get<int>(), 8);
}

TEST(VideoTraining, TrainsOnClipsAndWritesFrameStripsAndVideos) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("video_run");
  auto r = train_video(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3×4×32×32"), std::string::npos) << r.output;  // describe(): C×T×H×W latents
  EXPECT_NE(r.output.find("256 video + 12 text tokens"), std::string::npos) << r.output;
  const auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 6u);
  for (const auto& row : rows) EXPECT_TRUE(std::isfinite(row["loss"].get<double>()));
  // The grid: one clip a row, its 4 frames left to right (32-pixel frames, 2-pixel padding).
  const at::Tensor grid = flowtrain::data::read_png(run + "/samples/step-0000006.png");
  EXPECT_EQ(grid.size(0), 2 + 2 * (32 + 2)) << grid.sizes();
  EXPECT_EQ(grid.size(1), 2 + 4 * (32 + 2)) << grid.sizes();
  EXPECT_TRUE(fs::exists(run + "/samples/step-0000006/00000.mp4"));
  EXPECT_TRUE(fs::exists(run + "/samples/step-0000006/00001.mp4"));
  if (flowtrain::data::video_supported()) {  // played at the rate the clips were read at (8: the set's own)
    const auto info = flowtrain::data::probe_video(read_file(run + "/samples/step-0000006/00000.mp4"), "sample");
    EXPECT_EQ(info.frames, 4);
    EXPECT_NEAR(info.fps, 8.0, 1e-6);
  }

  // `flowtrain eval` judges motion following on the evaluation prompts and writes eval.json.
  auto e = run_flowtrain("eval -c " + run + "/config.yaml --checkpoint " + run + "/checkpoints/step-0000006 --num 6");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto report = nlohmann::json::parse(read_file(run + "/checkpoints/step-0000006/eval.json"));
  for (const char* key : {"prompt_accuracy", "class_accuracy", "color_accuracy", "direction_accuracy",
                          "temporal_consistency", "prompt_accuracy_ceiling", "class_accuracy_ceiling",
                          "color_accuracy_ceiling", "direction_accuracy_ceiling"}) {
    ASSERT_TRUE(report.contains(key)) << key;
    EXPECT_GE(report[key].get<double>(), 0.0) << key;
    EXPECT_LE(report[key].get<double>(), 1.0) << key;
  }
  EXPECT_EQ(report["num"].get<int>(), 6);

  // The model and the data must agree on the clip length: one error naming both keys.
  auto bad = train_video(scratch_dir("video_bad"), {"model.frames=2"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("'data.video.frames' is 4 but 'model.frames' is 2"), std::string::npos) << bad.output;
  auto one = train_video(scratch_dir("video_one_frame"), {"model.frames=1", "data.video.frames=1"});
  EXPECT_NE(one.exit_code, 0);
  EXPECT_NE(one.output.find("'data.video.frames' is 1: one-frame clips are images"), std::string::npos) << one.output;
  // A video model on an image source is refused before anything is written.
  auto images = run_flowtrain("train -c " + source_path("tests/configs/tiny_video.yaml") + " --set run.out_dir=" +
                              scratch_dir("video_on_images") + " --set data.source=fashion_mnist --set data.path=" +
                              fashion_mnist_dir() + " --set model.in_channels=1");
  EXPECT_NE(images.exit_code, 0);
  EXPECT_NE(images.output.find("'model.frames' is 4 (a video model) but data.source 'fashion_mnist' holds images"),
            std::string::npos)
      << images.output;
}
