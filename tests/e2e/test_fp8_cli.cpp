// fp8 through the command line: a run with a recipe trains (emulated on the CPU, said in the
// log, checkpoints loadable by a run without fp8), and `flowtrain numerics` reports every
// converted layer of a trained checkpoint.
#include "cli_runner.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

using namespace flowtrain::test;

TEST(Fp8Cli, ADelayedScalingRunTrainsAndItsCheckpointResumesWithoutFp8) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("fp8_delayed");
  auto r = train_tiny(run, {"fp8.recipe=delayed", "train.steps=30", "checkpoint.every=15"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(run + "/log.txt");
  EXPECT_NE(log.find("fp8.recipe delayed is emulated"), std::string::npos) << log;
  EXPECT_NE(log.find("fp8 delayed (emulated): 8 linears converted [blocks.*.attn.qkv x2"), std::string::npos) << log;
  const auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 30u);
  // The same fall as the fp32 tiny run (TrainCli.TinyConfigTrainsFiftyStepsAndLossFalls): fp8's
  // error is far below what 30 steps of learning move the loss.
  const double first = rows[0]["loss"].get<double>(), last = rows[29]["loss"].get<double>();
  EXPECT_LT(last, 0.8 * first) << first << " -> " << last;
  // Parameter names and shapes did not change: a plain fp32 run resumes from the checkpoint.
  auto resumed = train_tiny(run, {"train.steps=35"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(read_file(run + "/log.txt").find("step 35/35"), std::string::npos);
}

// Delayed scaling's state is the amax histories: a run resumed from step 10 must scale step 11
// as the straight run does (without the histories it would scale dynamically and drift). The
// sample grid at step 10, drawn just before the checkpoint, must leave no amaxes behind either.
TEST(Fp8Cli, ADelayedScalingRunResumesBitForBit) {
  REQUIRE_DATA();
  const std::vector<std::string> sets = {"fp8.recipe=delayed", "checkpoint.every=10", "sample.every=10",
                                         "train.steps=20"};
  const std::string straight = scratch_dir("fp8_straight");
  ASSERT_EQ(train_tiny(straight, sets).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(straight + "/samples/step-0000010.png"));
  const std::string resumed = scratch_dir("fp8_resumed");
  ASSERT_EQ(train_tiny(resumed, {"fp8.recipe=delayed", "checkpoint.every=10", "sample.every=10", "train.steps=10"})
                .exit_code,
            0);
  auto r = train_tiny(resumed, sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("amax histories of 8 linears restored"), std::string::npos) << r.output;
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "fp8.safetensors"})
    EXPECT_EQ(read_file(ckpt(straight, 20) + "/" + f), read_file(ckpt(resumed, 20) + "/" + f)) << f;
  const auto a = read_metrics(straight), b = read_metrics(resumed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"loss", "grad_norm"}) EXPECT_EQ(a[i][key], b[i][key]) << key << " at row " << i;
}

TEST(Fp8Cli, NumericsReportsEveryConvertedLayerOfACheckpoint) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("fp8_numerics");
  ASSERT_EQ(train_tiny(run, {"train.steps=20"}).exit_code, 0);
  const std::string json = run + "/numerics.json";
  auto r = run_flowtrain("numerics -c " + run + "/config.yaml --checkpoint " + ckpt(run, 20) +
                         " --recipe tensorwise --recipe mxfp8 --recipe mxfp8_rceil --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("whole model: loss"), std::string::npos) << r.output;
  const nlohmann::json j = nlohmann::json::parse(read_file(json));
  for (const char* recipe : {"tensorwise", "mxfp8", "mxfp8_rceil"}) {
    SCOPED_TRACE(recipe);
    const auto& rec = j["recipes"][recipe];
    ASSERT_EQ(rec["layers"].size(), 8u);
    EXPECT_EQ(rec["layers"][0]["name"], "blocks.0.attn.qkv");
    for (const auto& layer : rec["layers"]) {
      // torchao's per-linear thresholds (tests/unit/test_fp8.cpp) hold on real activations too.
      EXPECT_GE(layer["sqnr_out_db"].get<double>(), 18) << layer;
      EXPECT_GE(layer["sqnr_grad_input_db"].get<double>(), 18) << layer;
      EXPECT_GE(layer["sqnr_grad_weight_db"].get<double>(), 17) << layer;
      EXPECT_GT(layer["amax"].get<double>(), 0) << layer;
      EXPECT_LT(layer["underflow"].get<double>(), 0.01) << layer;
    }
    // One batch through 2 blocks: fp8's loss moves by well under 1 % (measured ~2e-4), its
    // gradient norm by a few % at most (measured 0.1-2 %).
    EXPECT_LT(rec["loss_rel_diff"].get<double>(), 0.01);
    EXPECT_LT(rec["grad_norm_rel_diff"].get<double>(), 0.1);
  }
  // Tensor scaling puts each tensor's amax on 448, and MX scales rounded up keep every block
  // at or under it: nothing is clipped.
  for (const char* recipe : {"tensorwise", "mxfp8_rceil"})
    for (const auto& layer : j["recipes"][recipe]["layers"]) EXPECT_EQ(layer["saturated"].get<double>(), 0) << layer;

  auto bad = run_flowtrain("numerics -c " + run + "/config.yaml --checkpoint " + ckpt(run, 20) +
                           " --set fp8.include=nothing.*");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("no linear matched 'fp8.include'"), std::string::npos) << bad.output;
}
