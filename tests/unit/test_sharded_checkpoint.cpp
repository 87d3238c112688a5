// Sharded checkpoints: the layout record, consolidation and re-cutting of shards, and the
// multi-writer commit protocol (ranks simulated by threads sharing a barrier).
#include "test_util.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/shard_layout.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;
using namespace flowtrain;
using namespace flowtrain::trainer;

namespace {

// Two units over three parameters plus one fixed (unsharded) table, 2 shards.
ShardLayout two_unit_layout() {
  ShardLayout l;
  l.num_shards = 2;
  parallel::FsdpUnitLayout a{"blocks.0", 7, 8, 4, {{"blocks.0.w", {2, 3}, 0, 6}, {"blocks.0.b", {1}, 6, 1}}};
  parallel::FsdpUnitLayout root{"root", 5, 6, 3, {{"head.w", {5}, 0, 5}}};
  l.units = {a, root};
  l.order = {"pos", "blocks.0.w", "blocks.0.b", "head.w"};
  return l;
}

NamedTensors full_weights() {
  return {{"pos", at::full({2}, 9.0f)},
          {"blocks.0.w", at::arange(6, at::kFloat).view({2, 3})},
          {"blocks.0.b", at::full({1}, 6.0f)},
          {"head.w", at::arange(10, 15, at::kFloat)}};
}

// A reusable barrier for N threads.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != generation_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, generation_ = 0;
};

}  // namespace

TEST(ShardLayout, CutAndConsolidateAreInverseAndPaddingIsZero) {
  const ShardLayout l = two_unit_layout();
  const NamedTensors full = full_weights();
  NamedTensors s0 = cut_shard(l, full, "", 0, "test"), s1 = cut_shard(l, full, "", 1, "test");
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_TRUE(s0[0].second.equal(at::tensor({0.f, 1.f, 2.f, 3.f})));
  EXPECT_TRUE(s1[0].second.equal(at::tensor({4.f, 5.f, 6.f, 0.f})));  // 7 numbers padded to 8
  NamedTensors back = consolidate_shards(l, {s0, s1}, {{"pos", at::full({2}, 9.0f)}}, "", "test");
  ASSERT_EQ(back.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(back[i].first, full[i].first);  // the model's order, fixed tensors included
    EXPECT_TRUE(back[i].second.equal(full[i].second)) << full[i].first;
  }
  // The layout survives its JSON record.
  const ShardLayout again = ShardLayout::from_json(l.to_json(), "test");
  EXPECT_EQ(again.to_json(), l.to_json());
}

TEST(ShardLayout, MismatchesAreErrorsNamingTheTensor) {
  const ShardLayout l = two_unit_layout();
  NamedTensors wrong = full_weights();
  wrong[1].second = at::zeros({3, 2});
  try {
    cut_shard(l, wrong, "", 0, "ckpt");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.w"), std::string::npos) << e.what();
  }
  nlohmann::json bad = l.to_json();
  bad["units"][0]["shard_numel"] = 3;
  EXPECT_THROW(ShardLayout::from_json(bad, "ckpt"), CheckpointError);
}

TEST(ShardedCheckpoint, TwoWritersCommitOneCheckpointThatLoadsWholeOrPerShard) {
  const std::string dir = test::scratch_dir("sharded") + "/checkpoints";
  const ShardLayout l = two_unit_layout();
  // The two ranks' votes at the end of each phase of the protocol (a per-phase tally, read after
  // both have added theirs).
  Barrier barrier(2);
  std::array<std::atomic<int>, 8> votes{};
  NamedTensors moments;  // optimizer state is keyed "exp_avg.<param>" / "exp_avg_sq.<param>"
  for (const auto& [n, t] : full_weights()) {
    moments.emplace_back("exp_avg." + n, t);
    moments.emplace_back("exp_avg_sq." + n, t * 2);
  }
  auto rank_main = [&](int rank) {
    CheckpointContents c;
    c.model = cut_shard(l, full_weights(), "", rank, "test");
    c.optimizer = cut_shard(l, moments, "exp_avg.", rank, "test");
    for (auto& item : cut_shard(l, moments, "exp_avg_sq.", rank, "test")) c.optimizer.push_back(item);
    c.progress.step = 4;
    c.config_yaml = "run: {}\n";
    c.world_size = 2;
    ShardedContents sh;
    sh.layout = l;
    sh.shard_index = rank;
    sh.fixed = {{"pos", at::full({2}, 9.0f)}};
    c.sharded = sh;
    size_t phase = 0;
    save_checkpoint(dir, c, SaveGroup{rank, [&](bool ok) {
                      votes.at(phase) += ok ? 1 : 0;
                      barrier.wait();
                      return votes.at(phase++).load() == 2;
                    },
                    {}});
  };
  std::thread other(rank_main, 1);
  rank_main(0);
  other.join();

  const std::string ckpt = dir + "/step-0000004";
  EXPECT_EQ(verify_checkpoint(ckpt), "");
  EXPECT_EQ(checkpoint_num_shards(ckpt), 2);
  EXPECT_FALSE(fs::exists(ckpt + "/files.shard-00000.json"));  // digests merged into the manifest
  CheckpointContents whole = load_checkpoint(ckpt);
  ASSERT_EQ(whole.model.size(), 4u);
  EXPECT_EQ(whole.model[0].first, "pos");
  EXPECT_TRUE(whole.model[3].second.equal(at::arange(10, 15, at::kFloat)));
  ASSERT_EQ(whole.optimizer.size(), 6u);  // moments of the 3 sharded parameters, per parameter
  EXPECT_EQ(whole.optimizer[3].first, "exp_avg_sq.blocks.0.w");
  EXPECT_TRUE(whole.optimizer[3].second.equal(at::arange(6, at::kFloat).view({2, 3}) * 2));
  CheckpointContents one = load_checkpoint_shard(ckpt, 1);
  EXPECT_TRUE(one.model[0].second.equal(at::tensor({4.f, 5.f, 6.f, 0.f})));

  // A damaged shard is refused by name, and a checkpoint missing a shard is not loadable.
  {
    std::fstream f(ckpt + "/model.shard-00001-of-00002.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  const std::string problem = verify_checkpoint(ckpt);
  EXPECT_NE(problem.find("model.shard-00001-of-00002.safetensors"), std::string::npos) << problem;
}
