// The loader over WebDataset shards. Worker threads each read some of this rank's canonical
// streams (stream_plan.h) through StreamReaders and decode samples (sample_decoder.h) into
// per-stream queues; an assembler thread takes samples in the rank's deterministic order
// (pick_stream) into batches, a bounded number ahead of the trainer. The batches, their order and
// the state after each do not depend on the number of workers.
//
// Damaged samples (a corrupt image, a missing declared member, a truncated or unreachable shard)
// are skipped and counted; the first few are logged with their key and reason. data.on_error
// fail stops at the first; with skip, the loader stops once more than max_skip_fraction of the
// samples it handed out were damaged (judged over at least 1 / max_skip_fraction samples, so one
// bad sample early does not stop a run), naming the last shard. A rank whose streams run dry
// before the epoch's agreed end (only after skips) repeats samples of the batch to fill it and
// counts them (`repeated`).
#pragma once

#include "data/batch_source.h"
#include "data/shards/byte_stream.h"
#include "data/shards/sample_decoder.h"
#include "data/shards/stream_reader.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace flowtrain::data {

struct ShardLoaderOptions {
  std::vector<std::string> shards;     // entries (shard_list.h)
  std::vector<int64_t> shard_samples;  // their sample counts (shard_index.h)
  int64_t streams = 1;                 // data.streams: the canonical partition, fixed for a run
  int64_t shuffle_buffer = 256;        // per stream
  int64_t global_batch = 64;
  int64_t workers = 2;                 // at least 1
  int64_t prefetch = 4;                // batches
  uint64_t seed = 0;
  int64_t rank = 0, world = 1;
  int64_t image_size = 0;              // images are padded (black, centred) to this side; 0: as decoded
  bool pin_memory = false;
  FetchOptions fetch;
  SampleSpec spec;
  bool fail_on_damage = false;         // data.on_error: fail
  double max_skip_fraction = 0.01;
  // One line each; default: stderr. Called from the loader's worker and assembler threads, never
  // two calls at once (the loader serializes them), so the callback needs no lock of its own.
  std::function<void(const std::string&)> warn;
};

class ShardLoader final : public BatchSource {
 public:
  // `start`: a default state starts epoch 0. A resumed one carries every stream's count (merged
  // from all ranks' checkpointed states); batches_left < 0 recomputes the epoch's end for this
  // world size. Throws DataError for a state that does not fit the streams, or an epoch that
  // gives a rank less than one batch.
  ShardLoader(ShardLoaderOptions options, LoaderState start = {});
  ~ShardLoader() override;
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  Batch next() override;
  LoaderState state() const override;
  // A hash of what decides each stream's order: shard base names and counts, streams, shuffle
  // buffer, seed. Ranks must agree on it, and a resume must find the checkpoint's.
  uint64_t fingerprint() const;
  // Bytes of sample members the workers have read so far (encoded, as stored in the shards).
  int64_t member_bytes_read() const { return member_bytes_read_.load(); }

 private:
  struct Item {
    std::string key, shard, error;
    DecodedSample sample;
    int64_t stream = -1, emission = -1;  // where it came from: the stream and its draw index this epoch
  };
  using QueueKey = std::pair<int64_t, int64_t>;  // (epoch, stream)

  const std::vector<int64_t>& stream_lengths(int64_t epoch);  // under mutex_
  void worker_loop(int64_t worker);
  void assembler_loop();
  // Takes samples in the rank's order until a batch is complete: local_batch items (of one
  // bucket), or fewer when the rank's streams ran dry (`repeated` rows then repeat them).
  std::vector<Item> gather_batch(const std::vector<int64_t>& lengths, int64_t& repeated);
  // A resumed run: re-reads the samples that waited in buckets at the save (start.pending).
  void restore_pending(const std::vector<int64_t>& pairs);
  // Stream `stream` of `epoch` (its shards from `plan`, the epoch's stream_shards), after `start`
  // draws.
  std::unique_ptr<StreamReader> open_stream(const std::vector<std::vector<int64_t>>& plan, int64_t epoch,
                                            int64_t stream, int64_t start) const;
  // Draw `draw` of a stream, decoded, or carrying why it is damaged.
  Item make_item(const RawSample& raw, int64_t epoch, int64_t stream, int64_t draw) const;
  // The seed of a sample's random choices (a video clip's start): (run seed, epoch, stream, draw).
  uint64_t draw_seed(int64_t epoch, int64_t stream, int64_t draw) const;
  Item take_item(int64_t epoch, int64_t stream);
  void on_damaged(const Item& item);
  Batch make_batch(std::vector<const DecodedSample*>& samples);
  void fail(std::exception_ptr error);

  ShardLoaderOptions options_;
  int64_t local_batch_ = 0;
  int64_t queue_capacity_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable item_cv_, space_cv_, ready_cv_, taken_cv_;
  std::map<QueueKey, std::deque<Item>> queues_;
  std::map<int64_t, std::vector<std::vector<int64_t>>> plans_;  // epoch -> stream shards
  std::map<int64_t, std::vector<int64_t>> lengths_;             // epoch -> stream lengths
  LoaderState start_;
  int64_t assembling_epoch_ = 0;  // the epoch the assembler is in (workers stay within one ahead)
  std::deque<Batch> ready_;
  LoaderState consumed_;
  std::exception_ptr error_;
  bool stopping_ = false;

  // The assembler's running state (its thread only).
  LoaderState cursor_;
  int64_t handed_out_here_ = 0, skipped_here_ = 0;
  DecodedSample last_sample_;
  std::vector<std::deque<Item>> pending_;  // with buckets: samples waiting for their bucket to fill
  std::atomic<int64_t> member_bytes_read_{0};
  std::shared_ptr<std::atomic<bool>> cancel_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::thread> threads_;
};

}  // namespace flowtrain::data
