// The batch source of a run, from the data section: the in-memory loader (fashion_mnist,
// compositions, synthetic: data/loader.h) or the shard loader (shards: data/shards/). For shards
// it resolves the entries (patterns, list file), their sample counts (index or reading), the
// canonical stream count and what each sample must hold, all before training starts, so a bad
// pattern, a missing file or an unreachable URL is one error naming it.
#pragma once

#include "data/batch_source.h"
#include "data/image_dataset.h"
#include "data/shards/shard_loader.h"
#include "trainer/config/config.h"

#include <c10/core/Device.h>

#include <memory>

namespace flowtrain::trainer {

// data.streams resolved: the configured value, or auto = min(shards, 4 × ranks × workers).
// A resumed run keeps its checkpoint's count (`resumed_streams` > 0).
int64_t resolve_streams(const DataConfig& data, int64_t shards, int64_t dp_size, int64_t resumed_streams = 0);

// Everything the shard loader needs from the config (throws DataError / ConfigError naming the
// key or file). `resumed_streams`: the stream count of the checkpoint being resumed (0: none).
data::ShardLoaderOptions shard_loader_options(const Config& config, int64_t dp_rank, int64_t dp_size,
                                              const c10::Device& device, int64_t resumed_streams = 0);

// The run's batches. `dataset` is the in-memory set (null for shards).
std::unique_ptr<data::BatchSource> make_batch_source(const Config& config,
                                                     std::shared_ptr<const data::ImageDataset> dataset,
                                                     int64_t dp_rank, int64_t dp_size, const c10::Device& device,
                                                     const data::LoaderState& start);

}  // namespace flowtrain::trainer
