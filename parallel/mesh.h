// The device mesh: world = dp_replicate × dp_shard × cp, in that order (cp varies fastest, so a
// context-parallel group is a run of adjacent ranks — on one node when cp ≤ GPUs per node — and
// a dp_shard group spans the next level out; replicas are the outermost, i.e. across nodes).
//
//   rank = (replicate · dp_shard + shard) · cp + context
//
// Hybrid context parallelism splits the context group once more: cp = cp_ulysses × ring groups,
// Ulysses innermost (context = ring_index · cp_ulysses + ulysses_index), so each all-to-all stays
// among cp_ulysses adjacent ranks (one node's fast links) and only the ring's point-to-point hops
// cross the slower level.
//
// Parameters are sharded over dp_shard × cp (as TorchTitan does), gradients are reduce-scattered
// over that shard group (summed over its context ranks, averaged over its data-parallel ones)
// and all-reduced over the replicate group (HSDP).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace flowtrain::parallel {

struct MeshError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct MeshShape {
  int64_t dp_replicate = 1;
  int64_t dp_shard = -1;  // −1: whatever is left of the world
  int64_t cp = 1;
  int64_t cp_ulysses = 1;  // the Ulysses degree inside cp (hybrid); 1 = no inner split
};

struct MeshCoord {
  int64_t replicate = 0, shard = 0, context = 0;
};

class Mesh {
 public:
  // Resolves dp_shard = −1 and checks dp_replicate · dp_shard · cp == world; throws MeshError
  // naming the `parallel.*` keys when they do not multiply out.
  Mesh(MeshShape shape, int64_t world);

  int64_t world() const { return world_; }
  const MeshShape& shape() const { return shape_; }
  int64_t data_parallel() const { return shape_.dp_replicate * shape_.dp_shard; }  // batch split
  MeshCoord coord(int64_t rank) const;
  int64_t rank_of(const MeshCoord& c) const;
  // The index of `rank` among the data-parallel ranks (its slice of the global batch).
  int64_t data_parallel_rank(int64_t rank) const;

  // Members (global ranks, ascending) of the groups that contain `rank`.
  // The ranks parameters are sharded over: same replicate, i.e. dp_shard × cp of them. The
  // context ranks of a sample slice hold different tokens but the same weights, so they share
  // the sharding work as data-parallel ranks do (TorchTitan shards over dp_shard × cp too).
  std::vector<int64_t> shard_group(int64_t rank) const;

  std::vector<int64_t> replicate_group(int64_t rank) const;  // same shard, same context
  std::vector<int64_t> context_group(int64_t rank) const;    // same replicate, same shard
  // The hybrid split of the context group (cp_ulysses > 1): the cp_ulysses adjacent members
  // that trade tokens for heads, and the cp / cp_ulysses members at the same position in each
  // of those runs, around which the ring passes K/V.
  std::vector<int64_t> context_ulysses_group(int64_t rank) const;
  std::vector<int64_t> context_ring_group(int64_t rank) const;
  std::string describe() const;  // "dp_replicate 2 × dp_shard 2 × cp 1 = 4" (cp "4 (ulysses 2 × ring 2)")

 private:
  MeshShape shape_;
  int64_t world_;
};

}  // namespace flowtrain::parallel
