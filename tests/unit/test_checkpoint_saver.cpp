// Asynchronous saves (trainer/checkpoint/checkpoint_saver.h): staging isolates the save from the
// live state, async and sync write the same bytes, the staging buffers are allocated once (at the
// first save, or ahead of it by reserve), and a save that cannot be written (disk full, another
// rank failing) leaves nothing complete-looking.
#include "test_util.h"
#include "trainer/checkpoint/checkpoint_saver.h"
#include "trainer/checkpoint/staging.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain::trainer;
using flowtrain::test::read_file;
using flowtrain::test::scratch_dir;

namespace {

// A state big enough that a file-size limit of 64 KiB stops its first file part-way.
CheckpointContents live_state(int64_t step) {
  CheckpointContents c;
  at::manual_seed(step);
  c.model = {{"w", at::randn({256, 256})}, {"b", at::randn({256})}};
  c.ema = {{"w", at::randn({256, 256})}, {"b", at::randn({256})}};
  c.optimizer = {{"exp_avg.w", at::randn({256, 256})}, {"exp_avg_sq.w", at::rand({256, 256})}};
  c.rng = {{"cpu", at::arange(16, at::kByte)}};
  c.progress.step = step;
  c.progress.samples_seen = step * 8;
  c.progress.lr = 1e-4;
  c.progress.loader = {1, 24};
  c.optimizer_step_count = step;
  c.config_yaml = "run:\n  name: saver\n";
  return c;
}

void expect_same_directory(const fs::path& a, const fs::path& b) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(a)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names.size(), static_cast<size_t>(std::distance(fs::directory_iterator(b), fs::directory_iterator())));
  for (const auto& name : names)
    EXPECT_EQ(read_file((a / name).string()), read_file((b / name).string())) << name << " differs";
}

// The file-size limit of `ulimit -f`, in force for a scope. Writes past it fail with EFBIG
// (SIGXFSZ ignored, as flowtrain's main does) instead of killing the process.
struct FileSizeLimit {
  rlimit saved{};
  explicit FileSizeLimit(rlim_t bytes) {
    std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &saved);
    rlimit limit = saved;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() { setrlimit(RLIMIT_FSIZE, &saved); }
};

}  // namespace

TEST(CheckpointSaver, AsyncSaveIsTheStateAtSaveTimeAndMatchesTheSyncSaveByteForByte) {
  const std::string base = scratch_dir("saver_bytes");
  CheckpointContents live = live_state(5);
  const CheckpointContents original = live_state(5);  // the same draws: what the files must hold

  CheckpointSaver async_saver(base + "/async", /*keep=*/0, {}, /*async=*/true);
  async_saver.save(live);
  // The step after a save overwrites weights, moments and EMA in place while the files are written.
  for (auto* part : {&live.model, &live.ema, &live.optimizer})
    for (auto& [name, t] : *part) t.add_(1.0);
  async_saver.wait();
  auto outcomes = async_saver.take_finished();
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_TRUE(outcomes[0].ok()) << outcomes[0].error;
  EXPECT_EQ(outcomes[0].path, base + "/async/step-0000005");
  EXPECT_GE(outcomes[0].persist_s, 0.0);

  CheckpointSaver sync_saver(base + "/sync", 0, {}, /*async=*/false);
  sync_saver.save(original);
  outcomes = sync_saver.take_finished();  // synchronous: finished when save() returns
  ASSERT_EQ(outcomes.size(), 1u);
  ASSERT_TRUE(outcomes[0].ok()) << outcomes[0].error;
  EXPECT_EQ(outcomes[0].blocked_s, outcomes[0].persist_s);  // training waited for all of it
  EXPECT_EQ(sync_saver.staging_bytes(), 0);                 // and no staging copy was made

  expect_same_directory(base + "/async/step-0000005", base + "/sync/step-0000005");
  const CheckpointContents loaded = load_checkpoint(base + "/async/step-0000005");  // verifies every CRC
  EXPECT_TRUE(at::equal(loaded.model[0].second, original.model[0].second));
  EXPECT_TRUE(at::equal(loaded.optimizer[1].second, original.optimizer[1].second));
}

TEST(CheckpointSaver, StagingBuffersAreAllocatedOnceAndReused) {
  CheckpointStager stager;
  CheckpointContents first = stager.stage(live_state(1));
  const void* w = first.model[0].second.data_ptr();
  const void* moment = first.optimizer[0].second.data_ptr();
  const int64_t bytes = stager.buffer_bytes();
  EXPECT_EQ(bytes, 4 * (3 * 256 * 256 + 2 * 256 + 256 * 256) + 16);  // model, EMA, 2 moments, rng
  CheckpointContents second = stager.stage(live_state(2));
  EXPECT_EQ(second.model[0].second.data_ptr(), w);
  EXPECT_EQ(second.optimizer[0].second.data_ptr(), moment);
  EXPECT_EQ(stager.buffer_bytes(), bytes);
  EXPECT_TRUE(at::equal(second.model[0].second, live_state(2).model[0].second));
}

TEST(CheckpointSaver, ReserveAllocatesEveryBufferAStageUsesAndCopiesNothing) {
  CheckpointStager stager;
  CheckpointContents state = live_state(1);
  state.fp8 = {{"blocks.0.amax_history", at::ones({16, 3})}};
  state.sharded = ShardedContents{};
  state.sharded->fixed = {{"pos_embed", at::randn({64, 8})}};
  stager.reserve(state);
  const int64_t bytes = 4 * (4 * 256 * 256 + 2 * 256) + 16 + 4 * 16 * 3 + 4 * 64 * 8;  // + rng, fp8, fixed
  EXPECT_EQ(stager.buffer_bytes(), bytes);  // every part, the sharded run's fixed tensors included

  const CheckpointContents staged = stager.stage(state);
  EXPECT_EQ(stager.buffer_bytes(), bytes);  // the stage found every buffer it needed
  const void* w = staged.model[0].second.data_ptr();
  stager.reserve(state);  // buffers that fit are kept as they are: not reallocated, not cleared
  EXPECT_TRUE(at::equal(staged.model[0].second, state.model[0].second));
  EXPECT_TRUE(at::equal(staged.sharded->fixed[0].second, state.sharded->fixed[0].second));
  EXPECT_TRUE(at::equal(staged.fp8[0].second, state.fp8[0].second));
  EXPECT_EQ(stager.stage(state).model[0].second.data_ptr(), w);

  CheckpointSaver sync_saver(scratch_dir("saver_reserve_sync"), 0, {}, /*async=*/false);
  sync_saver.reserve_staging(state);
  EXPECT_EQ(sync_saver.staging_bytes(), 0);  // synchronous saves stage nothing, so reserve nothing
}

TEST(CheckpointSaver, OneSaveInFlightAndKeepPrunesAfterEachCommit) {
  const std::string dir = scratch_dir("saver_keep");
  CheckpointSaver saver(dir, /*keep=*/2, {}, /*async=*/true);
  for (int64_t step : {10, 20, 30}) saver.save(live_state(step));  // each waits for the previous
  saver.wait();
  const auto outcomes = saver.take_finished();
  ASSERT_EQ(outcomes.size(), 3u);
  for (const auto& o : outcomes) EXPECT_TRUE(o.ok()) << o.error;
  EXPECT_FALSE(fs::exists(dir + "/step-0000010"));
  EXPECT_TRUE(fs::exists(dir + "/step-0000020/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-0000030/manifest.json"));
}

TEST(CheckpointSaver, DiskFullFailsTheSaveAndLeavesNothingCompleteInEitherMode) {
  for (const bool async : {false, true}) {
    const std::string dir = scratch_dir(async ? "saver_full_async" : "saver_full_sync");
    CheckpointSaver saver(dir, 0, {}, async);
    std::vector<SaveOutcome> outcomes;
    {
      FileSizeLimit limit(64 * 1024);  // the model file is ~263 KiB
      saver.save(live_state(3));
      saver.wait();
      outcomes = saver.take_finished();
    }
    ASSERT_EQ(outcomes.size(), 1u);
    EXPECT_FALSE(outcomes[0].ok());
    EXPECT_TRUE(outcomes[0].path.empty());
    EXPECT_NE(outcomes[0].error.find("model.safetensors"), std::string::npos) << outcomes[0].error;
    EXPECT_NE(outcomes[0].error.find("File too large"), std::string::npos) << outcomes[0].error;
    EXPECT_FALSE(fs::exists(dir + "/step-0000003")) << "a failed save looks complete";
    EXPECT_FALSE(fs::exists(dir + "/step-0000003.tmp")) << "a failed save left its partial directory";
    // With room again, the next save succeeds (checkpoint.on_error: warn retries at the next interval).
    saver.save(live_state(4));
    saver.wait();
    outcomes = saver.take_finished();
    ASSERT_EQ(outcomes.size(), 1u);
    EXPECT_TRUE(outcomes[0].ok()) << outcomes[0].error;
    EXPECT_EQ(verify_checkpoint(dir + "/step-0000004"), "");
  }
}

TEST(CheckpointSaver, AFailureOnAnotherRankFailsTheSaveHereToo) {
  const std::string dir = scratch_dir("saver_vote");
  // Rank 0 of two whose peer votes "failed" on the writing phase (its disk filled up).
  int phase = 0;
  SaveGroup group{0, [&phase](bool mine) { return ++phase == 2 ? false : mine; }, {}};
  CheckpointSaver saver(dir, 0, group, /*async=*/true);
  saver.save(live_state(8));
  saver.wait();
  const auto outcomes = saver.take_finished();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].ok());
  EXPECT_NE(outcomes[0].error.find("writing failed on another rank"), std::string::npos) << outcomes[0].error;
  EXPECT_FALSE(fs::exists(dir + "/step-0000008"));
  EXPECT_FALSE(fs::exists(dir + "/step-0000008.tmp"));
}
