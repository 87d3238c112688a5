// Checkpoint commit protocol: round trip, verification, fallback past damaged or partial saves.
#include "test_util.h"
#include "trainer/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using namespace flowtrain::trainer;

namespace {

CheckpointContents contents(int64_t step) {
  CheckpointContents c;
  c.model = {{"w", at::full({3}, float(step))}, {"b", at::arange(4, at::kFloat)}};
  c.ema = {{"w", at::full({3}, float(step) / 2)}, {"b", at::zeros({4})}};
  c.optimizer = {{"exp_avg.w", at::ones({3})}, {"exp_avg_sq.w", at::ones({3})}};
  c.rng = {{"cpu", at::arange(16, at::kByte)}};
  c.progress.step = step;
  c.progress.samples_seen = step * 8;
  c.progress.lr = 1e-4;
  c.progress.loader = {2, 40};
  c.optimizer_step_count = step;
  c.config_yaml = "run:\n  name: x\n";
  return c;
}

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char ch;
  f.read(&ch, 1);
  ch ^= 0x5a;
  f.seekp(at);
  f.write(&ch, 1);
}

}  // namespace

TEST(Checkpoint, RoundTripsEverything) {
  const std::string dir = flowtrain::test::scratch_dir("ckpt");
  const std::string path = save_checkpoint(dir, contents(7));
  EXPECT_EQ(fs::path(path).filename(), "step-0000007");
  EXPECT_FALSE(fs::exists(dir + "/step-0000007.tmp"));
  CheckpointContents c = load_checkpoint(path);
  ASSERT_EQ(c.model.size(), 2u);
  EXPECT_EQ(c.model[0].first, "w");
  EXPECT_TRUE(at::equal(c.model[0].second, at::full({3}, 7.0f)));
  EXPECT_TRUE(at::equal(c.ema[0].second, at::full({3}, 3.5f)));
  EXPECT_TRUE(at::equal(c.rng[0].second, at::arange(16, at::kByte)));
  EXPECT_EQ(c.progress.step, 7);
  EXPECT_EQ(c.progress.samples_seen, 56);
  EXPECT_EQ(c.progress.loader, (flowtrain::data::LoaderState{2, 40}));
  EXPECT_EQ(c.optimizer_step_count, 7);
  EXPECT_EQ(c.config_yaml, "run:\n  name: x\n");
}

TEST(Checkpoint, LatestSkipsPartialAndCorruptAndPruneKeepsNewest) {
  const std::string dir = flowtrain::test::scratch_dir("ckpt");
  save_checkpoint(dir, contents(5));
  save_checkpoint(dir, contents(10));
  save_checkpoint(dir, contents(15));
  // an interrupted save of step 20: files but no rename
  fs::create_directories(dir + "/step-0000020.tmp");
  std::ofstream(dir + "/step-0000020.tmp/model.safetensors") << "partial";
  auto latest = find_latest_checkpoint(dir, nullptr);
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path(*latest).filename(), "step-0000015");

  // a flipped byte in step 15's weights: CRC mismatch, fall back to step 10 with a warning
  flip_byte(dir + "/step-0000015/model.safetensors", 200);
  std::vector<std::string> warnings;
  latest = find_latest_checkpoint(dir, [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path(*latest).filename(), "step-0000010");
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("CRC-32 mismatch"), std::string::npos) << warnings[0];
  EXPECT_THROW(load_checkpoint(dir + "/step-0000015"), CheckpointError);

  // a truncated optimizer file is named in the error
  fs::resize_file(dir + "/step-0000010/optimizer.safetensors", 50);
  const std::string problem = verify_checkpoint(dir + "/step-0000010");
  EXPECT_NE(problem.find("optimizer.safetensors"), std::string::npos) << problem;
  EXPECT_NE(problem.find("truncated"), std::string::npos) << problem;

  // a missing manifest = not a checkpoint
  fs::remove(dir + "/step-0000005/manifest.json");
  EXPECT_FALSE(find_latest_checkpoint(dir, nullptr));

  prune_checkpoints(dir, 1);
  EXPECT_FALSE(fs::exists(dir + "/step-0000020.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/step-0000005"));
  EXPECT_FALSE(fs::exists(dir + "/step-0000010"));
  EXPECT_TRUE(fs::exists(dir + "/step-0000015"));
}

TEST(Checkpoint, RejectsForeignManifest) {
  const std::string dir = flowtrain::test::scratch_dir("ckpt");
  const std::string path = save_checkpoint(dir, contents(1));
  flowtrain::test::write_file(path + "/manifest.json", R"({"format": "something-else", "version": 1})");
  try {
    load_checkpoint(path);
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not a flowtrain checkpoint"), std::string::npos) << e.what();
  }
}
