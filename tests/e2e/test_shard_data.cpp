// WebDataset shards end to end through the CLI: `data pack` and `data inspect`, the default DiT
// config training from packed Fashion-MNIST shards, and a resume at the same world size that
// continues the sample stream (and the recorded keys) exactly.
#include "cli_runner.h"
#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

std::string read_lines_file(const std::string& path) { return fs::exists(path) ? read_file(path) : std::string(); }

}  // namespace

TEST(ShardData, PackInspectAndTrainFromShardsWithAnExactResume) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("shard_data");
  auto packed = run_flowtrain("data pack --from fashion-mnist --path " + fashion_mnist_dir() + " --out " + base +
                              "/shards --limit 300 --max-count 100");
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  const std::string pattern = base + "/shards/train-{000000..000002}.tar";
  EXPECT_NE(packed.output.find(pattern), std::string::npos) << packed.output;
  EXPECT_NE(packed.output.find("packed 300 samples into 3 shards"), std::string::npos) << packed.output;
  // A second pack into the same directory is refused (nothing overwritten).
  EXPECT_NE(run_flowtrain("data pack --from fashion-mnist --path " + fashion_mnist_dir() + " --out " + base +
                          "/shards --limit 10").exit_code, 0);

  auto inspect = run_flowtrain("data inspect " + base + "/shards/train-000000.tar");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("train-0000000  cls 1 B, png"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("100 samples (100 .cls, 100 .png, 100 .txt)"), std::string::npos) << inspect.output;
  // A damaged shard: inspect says so and exits 1.
  const std::string whole = read_file(base + "/shards/train-000001.tar");
  write_file(base + "/cut.tar", whole.substr(0, whole.size() / 2));
  auto damaged = run_flowtrain("data inspect --summary " + base + "/cut.tar");
  EXPECT_EQ(damaged.exit_code, 1) << damaged.output;
  EXPECT_NE(damaged.output.find("DAMAGED SHARD"), std::string::npos) << damaged.output;

  // Train 8 steps straight, and 4 + 4 with a resume: same losses, same keys.
  const std::vector<std::string> sets = {"data.source=shards", "data.shards=" + pattern, "data.record_keys=true",
                                         "data.streams=3", "train.threads=1", "train.log_every=1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  auto straight = train_tiny(base + "/straight", with({"train.steps=8"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_NE(straight.output.find("data: 3 shards, 300 samples, 3 streams"), std::string::npos) << straight.output;
  auto first = train_tiny(base + "/resumed", with({"train.steps=4"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = train_tiny(base + "/resumed", with({"train.steps=8"}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  const auto a = read_metrics(base + "/straight"), b = read_metrics(base + "/resumed");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  // Bit-exact: the same batches in the same order and the same per-step draws.
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(a[i].at("loss").get<double>(), b[i].at("loss").get<double>()) << i;
  const std::string keys_a = read_lines_file(base + "/straight/data/keys-rank-00000.txt");
  EXPECT_EQ(std::count(keys_a.begin(), keys_a.end(), '\n'), 8 * 32);
  EXPECT_EQ(keys_a, read_lines_file(base + "/resumed/data/keys-rank-00000.txt"));

  // Resuming on other order settings would point the stream counts at other samples: refused.
  auto changed = train_tiny(base + "/resumed", with({"train.steps=9", "data.shuffle_buffer=7"}));
  EXPECT_NE(changed.exit_code, 0);
  EXPECT_NE(changed.output.find("differ from those of the checkpoint being resumed"), std::string::npos)
      << changed.output;

  // A pipe: command that writes nothing (a wrong object key) is an error naming it, before training.
  auto empty = train_tiny(base + "/empty", {"data.source=shards", "'data.shards=pipe:cat " + base + "/gone.tar 2>/dev/null'"});
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.output.find("gone.tar 2>/dev/null: empty"), std::string::npos) << empty.output;

  // Bad input: a pattern matching no file is one error naming it, before training.
  auto missing = train_tiny(base + "/missing", {"data.source=shards", "data.shards=" + base + "/nope-{0..3}.tar"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope-0.tar does not exist"), std::string::npos) << missing.output;
}

TEST(ShardData, MakeMovingFashionWritesCaptionedVideoShards) {
  REQUIRE_DATA();
  const std::string dir = scratch_dir("moving_fashion") + "/mf";
  auto made = run_flowtrain("data make-moving-fashion --fashion-mnist " + fashion_mnist_dir() + " --out " + dir +
                            " --num 12 --frames 8 --max-count 5");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find(dir + "/train-{000000..000002}.tar"), std::string::npos) << made.output;
  auto inspect = run_flowtrain("data inspect " + dir + "/train-000000.tar");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("5 samples (5 .cls, 5 .json, 5 .mp4, 5 .txt)"), std::string::npos) << inspect.output;
  // Captions name colour, class and direction, as the metadata does.
  ASSERT_EQ(std::system(("tar -xOf " + dir + "/train-000000.tar clip-0000000.txt > " + dir + "/c.txt").c_str()), 0);
  ASSERT_EQ(std::system(("tar -xOf " + dir + "/train-000000.tar clip-0000000.json > " + dir + "/c.json").c_str()), 0);
  const std::string caption = read_file(dir + "/c.txt");
  const auto meta = nlohmann::json::parse(read_file(dir + "/c.json"));
  EXPECT_NE(caption.find(meta.at("color").get<std::string>() + " " + meta.at("class").get<std::string>() + " moving " +
                         meta.at("direction").get<std::string>()),
            std::string::npos)
      << caption;
}
