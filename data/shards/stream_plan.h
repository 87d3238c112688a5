// The order in which shards are read, as pure arithmetic over sample counts — no data touched.
//
// An epoch splits the shards into `streams` canonical streams (data.streams, fixed for the life
// of a run, independent of the world size): the shards are permuted by (seed, epoch) and dealt,
// in that order, each to the stream with the fewest samples so far (ties: the lowest stream), so
// streams differ by at most one shard's samples. A stream reads its shards one after another and
// passes their samples through a seeded shuffle buffer of fixed capacity (below), so a stream's
// output order is a pure function of (seed, epoch, stream, the shard counts).
//
// Streams are dealt to data-parallel ranks (stream c belongs to rank c mod world) and, within a
// rank, to loader workers. A rank takes its next sample from the owned stream that has handed
// out the fewest (ties: the lowest stream). The loader state is therefore the number of samples
// each stream has handed out: resuming each stream at its count continues every stream exactly —
// at the same world size bit-exactly, at another world size with each remaining sample of the
// epoch still seen exactly once.
#pragma once

#include <cstdint>
#include <vector>

namespace flowtrain::data {

struct EpochPlan {
  std::vector<std::vector<int64_t>> stream_shards;  // per stream: shard indices, in reading order
  std::vector<int64_t> stream_length;               // per stream: samples
};

// Throws DataError when there are fewer shards than streams or streams < 1.
EpochPlan plan_epoch(const std::vector<int64_t>& shard_samples, int64_t streams, uint64_t seed, int64_t epoch);

// The seeded stream seed of (seed, epoch, stream).
uint64_t stream_seed(uint64_t seed, int64_t epoch, int64_t stream);

// A shuffle buffer over input positions [0, length): it first holds positions 0 … capacity−1;
// each emission takes a uniformly drawn held position and refills its slot with the next input
// position (once the input is exhausted, the last slot moves into the gap). Which positions are
// emitted when depends only on (length, capacity, seed), so the buffer's state after k emissions
// is recomputed by replaying k draws — no data.
class ShuffleOrder {
 public:
  ShuffleOrder(int64_t length, int64_t capacity, uint64_t seed);
  bool exhausted() const { return held_.empty(); }
  int64_t emit();                                      // the input position handed out next
  int64_t next_input() const { return next_input_; }   // positions below it were read in
  const std::vector<int64_t>& held() const { return held_; }

 private:
  std::vector<int64_t> held_;
  int64_t length_, next_input_;
  uint64_t rng_state_;
};

// Rank and worker of a stream.
inline int64_t rank_of_stream(int64_t stream, int64_t world) { return stream % world; }
inline int64_t worker_of_stream(int64_t stream, int64_t world, int64_t workers) { return (stream / world) % workers; }

// The stream rank `rank` takes its next sample from, given each stream's count and length; −1
// when all its streams are exhausted.
int64_t pick_stream(const std::vector<int64_t>& counts, const std::vector<int64_t>& lengths, int64_t rank,
                    int64_t world);

// How many more batches of `local_batch` samples every rank can fill from its own streams: the
// epoch ends after that many steps (samples left then in other ranks' streams are not used).
int64_t batches_left_in_epoch(const std::vector<int64_t>& counts, const std::vector<int64_t>& lengths,
                              int64_t world, int64_t local_batch);

}  // namespace flowtrain::data
