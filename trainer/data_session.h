// A run's data session: the batch source of this rank and everything that makes its order
// resumable — the position in TrainProgress, the batches to discard (data.skip_batches and
// rollbacks), the shard loader's fingerprint and merged state, and the data.record_keys files.
// The Trainer asks it for the next batch and tells it when a batch was consumed; it never looks
// inside. For shards the merge, the fingerprint check and the totals are collectives over the
// world (every rank calls them at the same point); for the in-memory sources they are local.
#pragma once

#include "data/batch_source.h"
#include "data/image_dataset.h"
#include "data/shards/shard_loader.h"
#include "parallel/comm.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/telemetry/key_log.h"

#include <c10/core/Device.h>

#include <memory>
#include <vector>

namespace flowtrain::trainer {

// Where this rank reads in the run's layout.
struct DataPlacement {
  int64_t rank = 0;       // world rank (for messages)
  int64_t dp_rank = 0;    // this rank's slice of each global batch
  int64_t dp_size = 1;
  // Whether this rank speaks for its data-parallel rank: the first of its context-parallel group
  // (the others hold the same batches), so its counts are summed once and it writes the key file.
  bool data_lead = true;
  c10::Device device{c10::kCPU};
  parallel::Comm* world = nullptr;  // null in a single-process run
};

class DataSession {
 public:
  // `dataset`: the in-memory set (null for shards). Nothing is read until start().
  DataSession(const Config& config, std::shared_ptr<const data::ImageDataset> dataset, DataPlacement placement);
  ~DataSession();
  // Bytes of the in-memory data set the batches come from (0 for streamed shards).
  int64_t dataset_bytes() const { return dataset_ ? dataset_->nbytes() : 0; }

  // (Re)starts the batch source at `progress` (its loader state, the merged shard state of a
  // resume, the batches to discard): at the start of a run and after a rollback. Shards: checks
  // that all ranks and the resumed checkpoint see the same data (a collective), and opens the
  // data.record_keys file.
  void start(TrainProgress& progress);

  // The next batch of the data order, discarding the ordinals in progress.skip_batches (each
  // drawn batch counts in progress.batches_drawn).
  data::Batch next(TrainProgress& progress);
  // `batch` was trained on (or its update skipped by policy): the order moves past it.
  void consumed(const data::Batch& batch, TrainProgress& progress);

  // Shards: every rank's loader state merged, for a checkpoint (a collective over the world).
  ShardsDataState merged_shard_state(const data::LoaderState& mine);
  // Damaged samples skipped and samples repeated so far, over all ranks (shards: a collective).
  std::pair<int64_t, int64_t> skipped_and_repeated(const data::LoaderState& mine);

 private:
  // Shards: this rank's loader state at a resume, from the merged state of all ranks.
  data::LoaderState shard_start_state(const ShardsDataState& saved);
  // Shards: all ranks must read the same data, and a resume the data its checkpoint was made on.
  void check_shard_fingerprint(const data::ShardLoader& loader, const TrainProgress& progress);
  void open_key_log(const TrainProgress& progress);
  // The sum of `values` over data-parallel ranks (each counted once; a collective under FSDP).
  std::vector<int64_t> sum_over_data_ranks(std::vector<int64_t> values);

  const Config& config_;
  std::shared_ptr<const data::ImageDataset> dataset_;
  DataPlacement at_;
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<KeyLog> key_log_;  // data.record_keys, on the data lead
  // Key-file line counts of every rank at the resumed checkpoint, including ranks beyond the
  // current world (from a wider earlier world), which the merged state carries on.
  std::vector<int64_t> keys_written_carried_;
  uint64_t shard_fingerprint_ = 0;
};

}  // namespace flowtrain::trainer
