#include "trainer/data_session.h"

#include "parallel/gather.h"
#include "trainer/data_source.h"
#include "trainer/training_error.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;

namespace flowtrain::trainer {

DataSession::DataSession(const Config& config, std::shared_ptr<const data::ImageDataset> dataset,
                         DataPlacement placement)
    : config_(config), dataset_(std::move(dataset)), at_(placement) {}

DataSession::~DataSession() = default;

void DataSession::start(TrainProgress& progress) {
  const bool shards = config_.data.source == DataSource::shards;
  if (shards && progress.shards) progress.loader = shard_start_state(*progress.shards);
  source_.reset();  // a rollback's old loader stops its workers before the new one starts
  source_ = make_batch_source(config_, dataset_, at_.dp_rank, at_.dp_size, at_.device, progress.loader);
  if (const auto* loader = dynamic_cast<const data::ShardLoader*>(source_.get()))
    check_shard_fingerprint(*loader, progress);
  key_log_.reset();
  if (shards && config_.data.record_keys) open_key_log(progress);
}

data::Batch DataSession::next(TrainProgress& progress) {
  for (;;) {
    data::Batch batch = source_->next();
    progress.batches_drawn += 1;
    if (!progress.skip_batches.count(progress.batches_drawn)) return batch;
    progress.loader = batch.state_after;  // consumed, never trained on
    spdlog::warn("health: batch #{} is discarded (data.skip_batches, or a rollback past it); step {} takes the next",
                 progress.batches_drawn, progress.step + 1);
  }
}

void DataSession::consumed(const data::Batch& batch, TrainProgress& progress) {
  progress.loader = batch.state_after;
  if (key_log_) key_log_->append(batch.keys);
}

std::pair<int64_t, int64_t> DataSession::skipped_and_repeated(const data::LoaderState& mine) {
  const auto totals = sum_over_data_ranks({mine.skipped, mine.repeated});
  return {totals[0], totals[1]};
}

std::vector<int64_t> DataSession::sum_over_data_ranks(std::vector<int64_t> values) {
  if (!at_.world) return values;
  at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kLong));
  if (!at_.data_lead) t.zero_();  // context-parallel peers hold the same batches: counted once
  t = t.to(at_.device);
  at_.world->all_reduce(t, parallel::ReduceOp::Sum)->wait();
  t = t.cpu();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

data::LoaderState DataSession::shard_start_state(const ShardsDataState& saved) {
  const int64_t dp_rank = at_.dp_rank, dp_size = at_.dp_size;
  data::LoaderState s;
  s.epoch = saved.epoch;
  s.stream_counts = saved.stream_counts;
  // The epoch's end was agreed for the saved world size; another one recomputes it.
  s.batches_left = saved.world == dp_size && saved.global_batch == config_.data.batch_size ? saved.batches_left : -1;
  // Run totals sit on data-parallel rank 0, so the sum over ranks stays the total.
  s.skipped = dp_rank == 0 ? saved.skipped : 0;
  s.repeated = dp_rank == 0 ? saved.repeated : 0;
  s.keys_written = dp_rank < static_cast<int64_t>(saved.keys_written.size()) ? saved.keys_written[dp_rank] : 0;
  s.pending = saved.pending;  // all ranks'; the loader keeps those of the streams it owns now
  keys_written_carried_ = saved.keys_written;
  if (saved.world != dp_size)
    spdlog::info("data: resuming epoch {} at {} data-parallel ranks (saved at {}): every stream continues at its "
                 "count, so the epoch's remaining samples are each seen once",
                 saved.epoch, dp_size, saved.world);
  return s;
}

ShardsDataState DataSession::merged_shard_state(const data::LoaderState& mine) {
  const int64_t dp_rank = at_.dp_rank, dp_size = at_.dp_size;
  const auto streams = static_cast<int64_t>(mine.stream_counts.size());
  const int64_t ranks = std::max<int64_t>(dp_size, static_cast<int64_t>(keys_written_carried_.size()));
  // [stream counts (from each stream's owner) | skipped | repeated | key lines per rank |
  //  each rank's samples waiting in buckets: `slot` values per rank, stored +1 (0 = empty)]
  const int64_t slot = static_cast<int64_t>(config_.data.buckets.size()) * (config_.data.batch_size / dp_size) * 2;
  const int64_t pending_at = streams + 2 + ranks;
  if (static_cast<int64_t>(mine.pending.size()) > slot)
    throw TrainingError(fmt::format("{} samples wait in buckets, more than the {} a rank can hold",
                                    mine.pending.size() / 2, slot / 2));
  std::vector<int64_t> v(static_cast<size_t>(pending_at + dp_size * slot), 0);
  for (size_t i = 0; i < mine.pending.size(); ++i)
    v[static_cast<size_t>(pending_at + dp_rank * slot) + i] = mine.pending[i] + 1;
  for (int64_t c = dp_rank; c < streams; c += dp_size) v[static_cast<size_t>(c)] = mine.stream_counts[c];
  v[static_cast<size_t>(streams)] = mine.skipped;
  v[static_cast<size_t>(streams + 1)] = mine.repeated;
  v[static_cast<size_t>(streams + 2 + dp_rank)] = mine.keys_written;
  if (dp_rank == 0)
    for (int64_t r = dp_size; r < ranks; ++r) v[static_cast<size_t>(streams + 2 + r)] = keys_written_carried_[r];
  v = sum_over_data_ranks(std::move(v));
  ShardsDataState s;
  s.world = dp_size;
  s.global_batch = config_.data.batch_size;
  s.fingerprint = shard_fingerprint_;
  s.epoch = mine.epoch;
  s.batches_left = mine.batches_left;
  s.stream_counts.assign(v.begin(), v.begin() + streams);
  s.skipped = v[static_cast<size_t>(streams)];
  s.repeated = v[static_cast<size_t>(streams + 1)];
  s.keys_written.assign(v.begin() + streams + 2, v.begin() + pending_at);
  for (auto it = v.begin() + pending_at; it != v.end(); ++it)
    if (*it > 0) s.pending.push_back(*it - 1);
  return s;
}

void DataSession::check_shard_fingerprint(const data::ShardLoader& loader, const TrainProgress& progress) {
  shard_fingerprint_ = loader.fingerprint();
  // Every rank must plan the same streams: a shard counted differently on one rank (a failed
  // download there) would make ranks train overlapping or missing samples.
  const std::vector<int64_t> all =
      at_.world ? parallel::gather_value(*at_.world, static_cast<int64_t>(shard_fingerprint_), at_.device)
                : std::vector<int64_t>{static_cast<int64_t>(shard_fingerprint_)};
  for (size_t r = 0; r < all.size(); ++r)
    if (static_cast<uint64_t>(all[r]) != shard_fingerprint_)
      throw TrainingError(fmt::format("data: rank {} sees other shards or sample counts than rank {} (fingerprint "
                                      "{:016x} vs {:016x}); every rank must read the same data.shards and index",
                                      r, at_.rank, static_cast<uint64_t>(all[r]), shard_fingerprint_));
  if (progress.shards && progress.shards->fingerprint != shard_fingerprint_)
    throw TrainingError(fmt::format(
        "data: the shards, their sample counts, data.streams, data.shuffle_buffer or run.seed differ from those of the "
        "checkpoint being resumed (fingerprint {:016x} vs {:016x}): its stream counts would point at other samples. "
        "Restore the data settings, or start a new run directory",
        shard_fingerprint_, progress.shards->fingerprint));
}

void DataSession::open_key_log(const TrainProgress& progress) {
  if (!at_.data_lead) return;
  const auto lines = [&](int64_t r) {
    return r < static_cast<int64_t>(keys_written_carried_.size()) ? keys_written_carried_[r] : int64_t{0};
  };
  // Files of ranks beyond this world: cut back to the checkpoint too (a rank's lines after it
  // were never covered by a checkpoint); a fresh run empties leftovers of an earlier attempt.
  if (at_.rank == 0) {
    const fs::path dir = fs::path(config_.run.out_dir) / "data";
    if (fs::exists(dir))
      for (const auto& e : fs::directory_iterator(dir)) {
        int64_t r = -1;
        if (std::sscanf(e.path().filename().string().c_str(), "keys-rank-%ld.txt", &r) == 1 && r >= at_.dp_size)
          truncate_key_log(e.path().string(), lines(r));
      }
  }
  key_log_ = std::make_unique<KeyLog>(config_.run.out_dir, at_.dp_rank, progress.loader.keys_written);
}

}  // namespace flowtrain::trainer
