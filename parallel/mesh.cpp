#include "parallel/mesh.h"

#include <fmt/format.h>

namespace flowtrain::parallel {

Mesh::Mesh(MeshShape shape, int64_t world) : shape_(shape), world_(world) {
  if (world < 1) throw MeshError(fmt::format("world size must be >= 1, got {}", world));
  if (shape_.dp_replicate < 1)
    throw MeshError(fmt::format("parallel.dp_replicate must be >= 1, got {}", shape_.dp_replicate));
  if (shape_.cp < 1) throw MeshError(fmt::format("parallel.cp must be >= 1, got {}", shape_.cp));
  if (shape_.cp_ulysses < 1 || shape_.cp % shape_.cp_ulysses != 0)
    throw MeshError(fmt::format("parallel.cp_ulysses {} must divide parallel.cp {}", shape_.cp_ulysses, shape_.cp));
  if (shape_.dp_shard == -1) {
    const int64_t rest = shape_.dp_replicate * shape_.cp;
    if (world % rest != 0)
      throw MeshError(fmt::format("world size {} is not divisible by parallel.dp_replicate {} × parallel.cp {}",
                                  world, shape_.dp_replicate, shape_.cp));
    shape_.dp_shard = world / rest;
  }
  if (shape_.dp_shard < 1)
    throw MeshError(fmt::format("parallel.dp_shard must be >= 1 or -1 (the rest), got {}", shape_.dp_shard));
  if (shape_.dp_replicate * shape_.dp_shard * shape_.cp != world)
    throw MeshError(fmt::format("parallel.dp_replicate {} × parallel.dp_shard {} × parallel.cp {} = {}, but the world "
                                "size is {}",
                                shape_.dp_replicate, shape_.dp_shard, shape_.cp,
                                shape_.dp_replicate * shape_.dp_shard * shape_.cp, world));
}

MeshCoord Mesh::coord(int64_t rank) const {
  return {rank / (shape_.dp_shard * shape_.cp), (rank / shape_.cp) % shape_.dp_shard, rank % shape_.cp};
}

int64_t Mesh::rank_of(const MeshCoord& c) const {
  return (c.replicate * shape_.dp_shard + c.shard) * shape_.cp + c.context;
}

int64_t Mesh::data_parallel_rank(int64_t rank) const {
  const MeshCoord c = coord(rank);
  return c.replicate * shape_.dp_shard + c.shard;
}

std::vector<int64_t> Mesh::shard_group(int64_t rank) const {
  // Same replicate: a contiguous run of dp_shard · cp ranks (context innermost).
  const int64_t size = shape_.dp_shard * shape_.cp, first = coord(rank).replicate * size;
  std::vector<int64_t> ranks;
  for (int64_t r = first; r < first + size; ++r) ranks.push_back(r);
  return ranks;
}

std::vector<int64_t> Mesh::replicate_group(int64_t rank) const {
  MeshCoord c = coord(rank);
  std::vector<int64_t> ranks;
  for (c.replicate = 0; c.replicate < shape_.dp_replicate; ++c.replicate) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int64_t> Mesh::context_group(int64_t rank) const {
  MeshCoord c = coord(rank);
  std::vector<int64_t> ranks;
  for (c.context = 0; c.context < shape_.cp; ++c.context) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int64_t> Mesh::context_ulysses_group(int64_t rank) const {
  MeshCoord c = coord(rank);
  const int64_t first = c.context / shape_.cp_ulysses * shape_.cp_ulysses;
  std::vector<int64_t> ranks;
  for (c.context = first; c.context < first + shape_.cp_ulysses; ++c.context) ranks.push_back(rank_of(c));
  return ranks;
}

std::vector<int64_t> Mesh::context_ring_group(int64_t rank) const {
  MeshCoord c = coord(rank);
  std::vector<int64_t> ranks;
  for (c.context %= shape_.cp_ulysses; c.context < shape_.cp; c.context += shape_.cp_ulysses) ranks.push_back(rank_of(c));
  return ranks;
}

std::string Mesh::describe() const {
  const std::string cp = shape_.cp_ulysses > 1 && shape_.cp_ulysses < shape_.cp
                             ? fmt::format("{} (ulysses {} × ring {})", shape_.cp, shape_.cp_ulysses,
                                           shape_.cp / shape_.cp_ulysses)
                             : std::to_string(shape_.cp);
  return fmt::format("dp_replicate {} × dp_shard {} × cp {} = {}", shape_.dp_replicate, shape_.dp_shard, cp, world_);
}

}  // namespace flowtrain::parallel
