// Training from WebDataset shards across a world-size change: two ranks train part of an epoch
// and checkpoint; one rank resumes and finishes the epoch. The keys every rank recorded
// (data.record_keys) name each sample of the epoch exactly once.
#include "cli_runner.h"
#include "rank_runner.h"
#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string pack_fashion(const std::string& dir) {
  auto r = run_flowtrain("data pack --from fashion-mnist --path " + fashion_mnist_dir() + " --out " + dir +
                         " --limit 480 --max-count 60");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  const std::regex pattern("(/[^\\s]*train-\\{000000\\.\\.000007\\}\\.tar)");
  if (!std::regex_search(r.output, m, pattern)) ADD_FAILURE() << "no shard pattern printed:\n" << r.output;
  return m[1].str();
}

std::vector<std::string> shard_sets(const std::string& pattern, const std::string& steps) {
  return {"data.source=shards", "data.shards=" + pattern, "data.streams=4", "data.workers=1",
          "data.record_keys=true", "train.steps=" + steps, "train.threads=1", "train.log_every=1",
          "checkpoint.every=0"};
}

}  // namespace

TEST(DistShards, TwoRanksThenOneSeeEverySampleOfTheEpochExactlyOnce) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("dist_shards");
  const std::string pattern = pack_fashion(base + "/shards");  // 480 samples in 8 shards
  const std::string run = base + "/run";
  // Epoch: 480 samples, batch 32 -> 15 steps. Two ranks for 6 steps (192 samples) ...
  auto two = run_flowtrain("launch --nproc-per-node 2 -- " + tiny_train_args(run, shard_sets(pattern, "6")));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  // ... then one rank to step 15, the epoch's end (288 samples).
  auto one = train_tiny(run, shard_sets(pattern, "15"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("resuming epoch 0 at 1 data-parallel ranks (saved at 2)"), std::string::npos)
      << one.output;

  const auto rank0 = lines_of(run + "/data/keys-rank-00000.txt"), rank1 = lines_of(run + "/data/keys-rank-00001.txt");
  EXPECT_EQ(rank0.size(), 6u * 16 + 9u * 32);
  EXPECT_EQ(rank1.size(), 6u * 16);
  std::map<std::string, int> seen;
  for (const auto* keys : {&rank0, &rank1})
    for (const auto& k : *keys) ++seen[k];
  EXPECT_EQ(seen.size(), 480u);
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << key;
  EXPECT_EQ(seen.count("train-0000000"), 1u);
  EXPECT_EQ(seen.count("train-0000479"), 1u);
  // The metrics carry the epoch and the (zero) damage count.
  const auto rows = read_metrics(run);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.back().at("epoch").get<double>(), 0.0);
  EXPECT_EQ(rows.back().at("data_skipped").get<double>(), 0.0);
}
