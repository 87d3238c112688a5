#include "data/shards/stream_plan.h"

#include "data/data_error.h"
#include "data/loader.h"
#include "data/splitmix64.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace flowtrain::data {

EpochPlan plan_epoch(const std::vector<int64_t>& shard_samples, int64_t streams, uint64_t seed, int64_t epoch) {
  const auto shards = static_cast<int64_t>(shard_samples.size());
  if (streams < 1) throw DataError(fmt::format("data.streams must be at least 1, got {}", streams));
  if (shards < streams)
    throw DataError(fmt::format("{} shards cannot feed {} streams (data.streams): every stream needs a shard", shards,
                                streams));
  EpochPlan plan;
  plan.stream_shards.resize(static_cast<size_t>(streams));
  plan.stream_length.assign(static_cast<size_t>(streams), 0);
  for (int64_t shard : epoch_order(shards, seed ^ 0x5A4D5D5ull, epoch)) {
    const auto fewest = std::min_element(plan.stream_length.begin(), plan.stream_length.end()) -
                        plan.stream_length.begin();
    plan.stream_shards[static_cast<size_t>(fewest)].push_back(shard);
    plan.stream_length[static_cast<size_t>(fewest)] += shard_samples[static_cast<size_t>(shard)];
  }
  return plan;
}

uint64_t stream_seed(uint64_t seed, int64_t epoch, int64_t stream) {
  return splitmix64_mix(splitmix64_mix(seed + 0x5EEDull) ^ (static_cast<uint64_t>(epoch) * kGoldenGamma)) ^
         splitmix64_mix(static_cast<uint64_t>(stream) + 1);
}

ShuffleOrder::ShuffleOrder(int64_t length, int64_t capacity, uint64_t seed)
    : length_(length), next_input_(std::min(length, std::max<int64_t>(capacity, 1))), rng_state_(seed) {
  held_.resize(static_cast<size_t>(next_input_));
  for (int64_t i = 0; i < next_input_; ++i) held_[static_cast<size_t>(i)] = i;
}

int64_t ShuffleOrder::emit() {
  SplitMix64 rng{rng_state_};
  const auto slot = static_cast<size_t>(rng.below(held_.size()));
  rng_state_ = rng.state;
  const int64_t out = held_[slot];
  if (next_input_ < length_) {
    held_[slot] = next_input_++;
  } else {
    held_[slot] = held_.back();
    held_.pop_back();
  }
  return out;
}

int64_t pick_stream(const std::vector<int64_t>& counts, const std::vector<int64_t>& lengths, int64_t rank,
                    int64_t world) {
  int64_t best = -1;
  for (auto c = static_cast<size_t>(rank); c < counts.size(); c += static_cast<size_t>(world))
    if (counts[c] < lengths[c] && (best < 0 || counts[c] < counts[static_cast<size_t>(best)]))
      best = static_cast<int64_t>(c);
  return best;
}

int64_t batches_left_in_epoch(const std::vector<int64_t>& counts, const std::vector<int64_t>& lengths,
                              int64_t world, int64_t local_batch) {
  int64_t batches = std::numeric_limits<int64_t>::max();
  for (int64_t r = 0; r < world; ++r) {
    int64_t remaining = 0;
    for (auto c = static_cast<size_t>(r); c < counts.size(); c += static_cast<size_t>(world))
      remaining += lengths[c] - counts[c];
    batches = std::min(batches, remaining / local_batch);
  }
  return batches;
}

}  // namespace flowtrain::data
