// What the trainer draws batches from: the in-memory loader (data/loader.h: IDX, compositions,
// synthetic) or the shard loader (data/shards/shard_loader.h: WebDataset tars from any store).
// Both hand out batches in a deterministic order and say, with each batch, the loader state
// after it, which a checkpoint stores and a resumed loader starts from.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowtrain::data {

struct LoaderState {
  LoaderState() = default;
  LoaderState(int64_t epoch_, int64_t position_) : epoch(epoch_), position(position_) {}  // the in-memory state

  int64_t epoch = 0;
  // In-memory source: samples of `epoch` consumed by all ranks together. Shards: samples of
  // `epoch` this rank's streams handed out (used or skipped).
  int64_t position = 0;
  // Shards only (data/shards/stream_plan.h). Per canonical stream: samples of `epoch` it handed
  // out; each rank's own streams' entries are authoritative (stream c belongs to rank c mod world).
  std::vector<int64_t> stream_counts;
  int64_t batches_left = 0;  // batches until `epoch` ends
  int64_t skipped = 0;       // damaged samples skipped by this rank, over the whole run
  int64_t repeated = 0;      // samples repeated to fill a batch after skips emptied this rank's streams
  int64_t keys_written = 0;  // lines this rank wrote to its data.record_keys file
  // With aspect-ratio buckets: the samples handed out but waiting for their bucket to fill, as
  // (stream, draw index) pairs flattened, in the order they arrived.
  std::vector<int64_t> pending;
  bool operator==(const LoaderState& o) const {
    return epoch == o.epoch && position == o.position && stream_counts == o.stream_counts &&
           batches_left == o.batches_left && skipped == o.skipped && repeated == o.repeated &&
           keys_written == o.keys_written && pending == o.pending;
  }
};

struct Batch {
  at::Tensor images;  // float32 [b, C, H, W] in [−1, 1] (or latents), b = global_batch / world;
                      // clips (data.video.frames): [b, T, C, H, W], frame-major as decoded
  at::Tensor labels;  // int64 [b]
  std::map<std::string, at::Tensor> fields;  // the data set's per-sample fields, rows of this batch
  std::vector<std::string> keys;             // shards: the samples' keys, in row order
  LoaderState state_after;  // the loader state once this batch is consumed
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;                 // blocks until the next batch is ready; rethrows worker errors
  virtual LoaderState state() const = 0;    // the state after the last batch returned by next()
};

}  // namespace flowtrain::data
