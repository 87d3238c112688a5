// The device mesh: sizes, coordinates and the groups each rank belongs to.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

using flowtrain::parallel::Mesh;
using flowtrain::parallel::MeshError;
using flowtrain::parallel::MeshShape;

TEST(Mesh, ResolvesTheRestAndNumbersRanksWithContextInnermost) {
  Mesh m(MeshShape{2, -1, 2}, 8);  // 2 replicas × 2 shards × 2 context ranks
  EXPECT_EQ(m.shape().dp_shard, 2);
  EXPECT_EQ(m.data_parallel(), 4);
  // rank 5 = (1·2 + 0)·2 + 1
  EXPECT_EQ(m.coord(5).replicate, 1);
  EXPECT_EQ(m.coord(5).shard, 0);
  EXPECT_EQ(m.coord(5).context, 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coord(r)), r);
  EXPECT_EQ(m.shard_group(5), (std::vector<int64_t>{4, 5, 6, 7}));  // dp_shard × cp of replica 1
  EXPECT_EQ(m.replicate_group(5), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(m.context_group(5), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(m.data_parallel_rank(5), 2);  // context ranks of one sample slice share it
  EXPECT_EQ(m.data_parallel_rank(4), 2);
}

TEST(Mesh, HybridContextGroupsPutUlyssesOnAdjacentRanksAndTheRingAcrossThem) {
  // dp_shard 2 × cp 4, the cp split as Ulysses 2 × ring 2: the second sample slice is ranks 4–7.
  Mesh m(MeshShape{1, 2, 4, 2}, 8);
  EXPECT_EQ(m.context_group(6), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(m.context_ulysses_group(6), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(m.context_ring_group(6), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(m.context_ring_group(5), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(m.describe(), "dp_replicate 1 × dp_shard 2 × cp 4 (ulysses 2 × ring 2) = 8");
  // Every member of a context group is in exactly one Ulysses group and one ring group, and the
  // two meet in that member alone.
  for (int64_t r = 4; r < 8; ++r) {
    int64_t both = 0;
    for (int64_t u : m.context_ulysses_group(r))
      for (int64_t g : m.context_ring_group(r)) both += (u == g);
    EXPECT_EQ(both, 1) << r;
  }
}

TEST(Mesh, PlainShardingAndHsdp) {
  Mesh fsdp(MeshShape{}, 4);
  EXPECT_EQ(fsdp.shard_group(2), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(fsdp.replicate_group(2), (std::vector<int64_t>{2}));
  Mesh hsdp(MeshShape{2, -1, 1}, 4);
  EXPECT_EQ(hsdp.shard_group(3), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(hsdp.replicate_group(3), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(hsdp.describe(), "dp_replicate 2 × dp_shard 2 × cp 1 = 4");
}

TEST(Mesh, SizesThatDoNotMultiplyOutNameTheKeys) {
  auto message = [](MeshShape s, int64_t world) {
    try {
      Mesh m(s, world);
    } catch (const MeshError& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message({3, -1, 1}, 4).find("parallel.dp_replicate"), std::string::npos);
  EXPECT_NE(message({1, 3, 1}, 4).find("parallel.dp_shard 3"), std::string::npos);
  EXPECT_NE(message({1, -1, 0}, 4).find("parallel.cp"), std::string::npos);
  EXPECT_NE(message({1, 0, 1}, 4).find("parallel.dp_shard"), std::string::npos);
  EXPECT_NE(message({1, -1, 4, 3}, 4).find("parallel.cp_ulysses 3 must divide parallel.cp 4"), std::string::npos);
}
