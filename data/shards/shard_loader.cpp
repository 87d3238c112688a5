#include "data/shards/shard_loader.h"

#include "data/data_error.h"
#include "data/serial_thread.h"
#include "data/splitmix64.h"
#include "data/shards/shard_list.h"
#include "data/shards/stream_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <cmath>
#include <iostream>

namespace flowtrain::data {
namespace {

constexpr int64_t kLoggedSkips = 5;  // damaged samples named in the log; the rest only counted

int64_t owned_streams(int64_t streams, int64_t rank, int64_t world) {
  return streams / world + (rank < streams % world ? 1 : 0);
}

}  // namespace

ShardLoader::ShardLoader(ShardLoaderOptions options, LoaderState start)
    : options_(std::move(options)), start_(start) {
  std::function<void(const std::string&)> warn = std::move(options_.warn);
  if (!warn) warn = [](const std::string& line) { std::cerr << line << "\n"; };
  // Workers and the assembler warn from their own threads; one call at a time keeps a callback
  // that appends to a container (or any other unsynchronized sink) safe.
  options_.warn = [warn = std::move(warn), guard = std::make_shared<std::mutex>()](const std::string& line) {
    std::lock_guard<std::mutex> lock(*guard);
    warn(line);
  };
  options_.fetch.cancel = cancel_;  // the destructor stops pipe / HTTP reads that would block it
  options_.workers = std::max<int64_t>(options_.workers, 1);
  if (options_.shards.size() != options_.shard_samples.size())
    throw DataError("ShardLoader: one sample count per shard is needed");
  if (options_.global_batch % options_.world != 0)
    throw DataError(fmt::format("data.batch_size {} is not divisible by the {} data-parallel ranks",
                                options_.global_batch, options_.world));
  if (options_.streams < options_.world * options_.workers)
    throw DataError(fmt::format("data.streams {} is fewer than ranks × workers = {} × {}: every worker needs a "
                                "stream (raise data.streams, up to the {} shards)",
                                options_.streams, options_.world, options_.workers, options_.shards.size()));
  if (static_cast<int64_t>(options_.shards.size()) < options_.streams)
    throw DataError(fmt::format("{} shards are fewer than data.streams = {} (ranks × workers = {} × {} need at "
                                "least that many streams)",
                                options_.shards.size(), options_.streams, options_.world, options_.workers));
  local_batch_ = options_.global_batch / options_.world;
  queue_capacity_ = std::max<int64_t>(
      2, (options_.prefetch * local_batch_ + owned_streams(options_.streams, options_.rank, options_.world) - 1) /
             owned_streams(options_.streams, options_.rank, options_.world));

  cursor_ = start;
  if (cursor_.stream_counts.empty()) cursor_.stream_counts.assign(static_cast<size_t>(options_.streams), 0);
  if (static_cast<int64_t>(cursor_.stream_counts.size()) != options_.streams)
    throw DataError(fmt::format("loader state has {} streams; data.streams is {} (the stream count is fixed for the "
                                "life of a run)",
                                cursor_.stream_counts.size(), options_.streams));
  const auto& lengths = stream_lengths(cursor_.epoch);
  for (int64_t c = 0; c < options_.streams; ++c)
    if (cursor_.stream_counts[c] < 0 || cursor_.stream_counts[c] > lengths[c])
      throw DataError(fmt::format("loader state: stream {} handed out {} samples of epoch {}, which has {}", c,
                                  cursor_.stream_counts[c], cursor_.epoch, lengths[c]));
  if (start.stream_counts.empty() || cursor_.batches_left < 0)
    cursor_.batches_left = batches_left_in_epoch(cursor_.stream_counts, lengths, options_.world, local_batch_);
  if (cursor_.batches_left == 0 && start.stream_counts.empty())
    throw DataError(fmt::format("an epoch of the {} shards gives rank {} fewer than one batch of {} samples",
                                options_.shards.size(), options_.rank, local_batch_));
  cursor_.position = 0;
  for (int64_t c = options_.rank; c < options_.streams; c += options_.world) cursor_.position += cursor_.stream_counts[c];
  assembling_epoch_ = cursor_.epoch;

  pending_.resize(options_.spec.buckets.size());
  if (!start.pending.empty()) {
    if (pending_.empty()) throw DataError("loader state has samples waiting in buckets, but data.buckets is empty");
    restore_pending(start.pending);
  }
  cursor_.pending.clear();  // recomputed with each batch; this rank's are in pending_ now
  for (const auto& queue : pending_)
    for (const auto& item : queue) {
      cursor_.pending.push_back(item.stream);
      cursor_.pending.push_back(item.emission);
    }
  start_ = cursor_;
  consumed_ = cursor_;
  for (int64_t w = 0; w < options_.workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  threads_.emplace_back([this] { assembler_loop(); });
}

ShardLoader::~ShardLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  *cancel_ = true;
  item_cv_.notify_all();
  space_cv_.notify_all();
  ready_cv_.notify_all();
  taken_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

const std::vector<int64_t>& ShardLoader::stream_lengths(int64_t epoch) {
  auto it = lengths_.find(epoch);
  if (it != lengths_.end()) return it->second;
  EpochPlan plan = plan_epoch(options_.shard_samples, options_.streams, options_.seed, epoch);
  plans_[epoch] = std::move(plan.stream_shards);
  // Plans of epochs two behind are no longer read by anyone.
  plans_.erase(plans_.begin(), plans_.lower_bound(epoch - 2));
  lengths_.erase(lengths_.begin(), lengths_.lower_bound(epoch - 2));
  return lengths_[epoch] = std::move(plan.stream_length);
}

void ShardLoader::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = error;
  }
  item_cv_.notify_all();
  space_cv_.notify_all();
  ready_cv_.notify_all();
  taken_cv_.notify_all();
}

void ShardLoader::worker_loop(int64_t worker) {
  run_aten_serially_on_this_thread();  // decoding stays on this thread (data/serial_thread.h)
  try {
    for (int64_t epoch = start_.epoch;; ++epoch) {
      struct Owned {
        int64_t stream;
        std::unique_ptr<StreamReader> reader;
      };
      std::vector<Owned> owned;
      std::map<int64_t, int64_t> draws;  // per owned stream: draw index of its next sample this epoch
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // At most one epoch ahead of the assembler.
        space_cv_.wait(lock, [&] { return stopping_ || error_ || assembling_epoch_ >= epoch - 1; });
        if (stopping_ || error_) return;
        stream_lengths(epoch);
        const auto shards = plans_.at(epoch);
        lock.unlock();
        for (int64_t c = options_.rank; c < options_.streams; c += options_.world) {
          if (worker_of_stream(c, options_.world, options_.workers) != worker) continue;
          {
            std::lock_guard<std::mutex> guard(mutex_);
            if (stopping_ || error_) return;
          }
          const int64_t start_count = epoch == start_.epoch ? start_.stream_counts[c] : 0;
          draws[c] = start_count;
          owned.push_back({c, open_stream(shards, epoch, c, start_count)});
        }
      }
      for (;;) {
        bool progressed = false, all_exhausted = true;
        for (auto& [stream, reader] : owned) {
          if (reader->exhausted()) continue;
          all_exhausted = false;
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_ || error_) return;
            if (assembling_epoch_ > epoch) break;
            if (static_cast<int64_t>(queues_[{epoch, stream}].size()) >= queue_capacity_) continue;
          }
          const int64_t draw = draws[stream]++;
          RawSample raw = reader->next();
          for (const auto& [ext, bytes] : raw.members) member_bytes_read_ += static_cast<int64_t>(bytes.size());
          for (const auto& w : reader->take_warnings()) options_.warn(w);
          Item item = make_item(raw, epoch, stream, draw);
          {
            std::lock_guard<std::mutex> lock(mutex_);
            if (assembling_epoch_ > epoch) break;  // the epoch ended while this sample was decoded
            queues_[{epoch, stream}].push_back(std::move(item));
          }
          item_cv_.notify_all();
          progressed = true;
        }
        std::unique_lock<std::mutex> lock(mutex_);
        if (stopping_ || error_) return;
        if (all_exhausted || assembling_epoch_ > epoch) break;
        if (!progressed)
          space_cv_.wait(lock, [&] {
            if (stopping_ || error_ || assembling_epoch_ > epoch) return true;
            for (auto& o : owned)
              if (!o.reader->exhausted() && static_cast<int64_t>(queues_[{epoch, o.stream}].size()) < queue_capacity_)
                return true;
            return false;
          });
      }
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

ShardLoader::Item ShardLoader::take_item(int64_t epoch, int64_t stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& queue = queues_[{epoch, stream}];
  item_cv_.wait(lock, [&] { return stopping_ || error_ || !queue.empty(); });
  if (stopping_ || error_) throw std::runtime_error("loader stopping");
  Item item = std::move(queue.front());
  queue.pop_front();
  lock.unlock();
  space_cv_.notify_all();
  return item;
}

void ShardLoader::on_damaged(const Item& item) {
  ++cursor_.skipped;
  ++skipped_here_;
  if (options_.fail_on_damage)
    throw DataError(fmt::format("damaged sample {} in shard {} (data.on_error is fail): {}", item.key, item.shard,
                                item.error));
  if (skipped_here_ <= kLoggedSkips)
    options_.warn(fmt::format("skipped damaged sample {} (shard {}): {}{}", item.key, item.shard, item.error,
                              skipped_here_ == kLoggedSkips ? " — further skips are only counted (data_skipped)" : ""));
  const double judged = std::max<double>(static_cast<double>(handed_out_here_),
                                         std::ceil(1.0 / std::max(options_.max_skip_fraction, 1e-9)));
  if (static_cast<double>(skipped_here_) > options_.max_skip_fraction * judged)
    throw DataError(fmt::format("{} of {} samples were damaged, more than data.max_skip_fraction = {}; the last: "
                                "{} in shard {}: {}",
                                skipped_here_, handed_out_here_, options_.max_skip_fraction, item.key, item.shard,
                                item.error));
}

Batch ShardLoader::make_batch(std::vector<const DecodedSample*>& samples) {
  Batch batch;
  const int64_t side = options_.image_size;
  std::vector<at::Tensor> images;
  images.reserve(samples.size());
  for (const DecodedSample* s : samples) {
    at::Tensor image = s->image;
    if (!image.defined()) break;
    if (image.dim() == 3 && options_.spec.buckets.empty() && side > 0 &&
        (image.size(1) < side || image.size(2) < side)) {  // black, centred
      const int64_t top = (side - image.size(1)) / 2, left = (side - image.size(2)) / 2;
      image = at::constant_pad_nd(image, {left, side - image.size(2) - left, top, side - image.size(1) - top}, 0);
    }
    images.push_back(image);
  }
  if (!images.empty()) {
    for (const auto& image : images)
      if (image.sizes() != images[0].sizes() || image.scalar_type() != images[0].scalar_type())
        throw DataError(fmt::format("samples of shapes {} and {} in one batch: set model.image_size (images are padded "
                                    "to it)",
                                    c10::str(images[0].sizes()), c10::str(image.sizes())));
    batch.images = at::stack(images);  // uint8 images: scaled once per batch, not per sample
    if (batch.images.scalar_type() == at::kByte) batch.images = batch.images.to(at::kFloat).div_(127.5).sub_(1.0);
  }
  at::Tensor labels = at::empty({static_cast<int64_t>(samples.size())}, at::kLong);
  for (size_t i = 0; i < samples.size(); ++i) labels[static_cast<int64_t>(i)] = samples[i]->label;
  batch.labels = labels;
  for (const auto& [name, first] : samples[0]->fields) {
    std::vector<at::Tensor> rows;
    for (const DecodedSample* s : samples) {
      const auto it = s->fields.find(name);
      if (it == s->fields.end()) throw DataError(fmt::format("a sample lacks the field '{}' its batch-mates have", name));
      rows.push_back(it->second);
    }
    batch.fields[name] = at::stack(rows);
  }
  if (options_.pin_memory) {
    if (batch.images.defined()) batch.images = batch.images.pin_memory();
    batch.labels = batch.labels.pin_memory();
    for (auto& [name, field] : batch.fields) field = field.pin_memory();
  }
  return batch;
}

std::vector<ShardLoader::Item> ShardLoader::gather_batch(const std::vector<int64_t>& lengths, int64_t& repeated) {
  const bool bucketed = !pending_.empty();
  std::vector<Item> items;
  items.reserve(static_cast<size_t>(local_batch_));
  repeated = 0;
  for (;;) {
    if (bucketed) {
      for (auto& queue : pending_)  // the first full bucket, in data.buckets order
        if (static_cast<int64_t>(queue.size()) >= local_batch_) {
          for (int64_t i = 0; i < local_batch_; ++i) {
            items.push_back(std::move(queue.front()));
            queue.pop_front();
          }
          return items;
        }
    } else if (static_cast<int64_t>(items.size()) == local_batch_) {
      return items;
    }
    const int64_t c = pick_stream(cursor_.stream_counts, lengths, options_.rank, options_.world);
    if (c < 0) {  // this rank's streams ran dry before the agreed end
      if (bucketed) {  // the fullest bucket, then repeats
        auto fullest = std::max_element(pending_.begin(), pending_.end(),
                                        [](const auto& a, const auto& b) { return a.size() < b.size(); });
        for (auto& item : *fullest) items.push_back(std::move(item));
        fullest->clear();
      }
      repeated = local_batch_ - static_cast<int64_t>(items.size());
      return items;
    }
    Item item = take_item(cursor_.epoch, c);
    item.stream = c;
    item.emission = cursor_.stream_counts[static_cast<size_t>(c)];
    ++cursor_.stream_counts[static_cast<size_t>(c)];
    ++cursor_.position;
    ++handed_out_here_;
    if (!item.error.empty()) {
      on_damaged(item);
      continue;
    }
    if (bucketed) pending_[static_cast<size_t>(item.sample.bucket)].push_back(std::move(item));
    else items.push_back(std::move(item));
  }
}

void ShardLoader::restore_pending(const std::vector<int64_t>& pairs) {
  if (pairs.size() % 2 != 0) throw DataError("loader state: pending samples must be (stream, draw) pairs");
  // This rank's pairs (a resume at another world size re-deals them with their streams), in the
  // saved order; each stream's are read with one reader, in draw order.
  std::vector<std::pair<int64_t, int64_t>> mine;
  std::map<int64_t, std::vector<int64_t>> by_stream;
  for (size_t i = 0; i < pairs.size(); i += 2) {
    const int64_t c = pairs[i], k = pairs[i + 1];
    if (c < 0 || c >= options_.streams || k < 0 || k >= cursor_.stream_counts[static_cast<size_t>(c)])
      throw DataError(fmt::format("loader state: pending sample (stream {}, draw {}) is outside the state", c, k));
    if (rank_of_stream(c, options_.world) != options_.rank) continue;
    mine.emplace_back(c, k);
    by_stream[c].push_back(k);
  }
  if (mine.empty()) return;
  std::map<std::pair<int64_t, int64_t>, Item> read;
  const auto shards = plans_.at(cursor_.epoch);
  for (auto& [c, draws] : by_stream) {
    std::sort(draws.begin(), draws.end());
    const auto reader = open_stream(shards, cursor_.epoch, c, draws.front());
    for (int64_t k = draws.front(); k <= draws.back(); ++k) {
      const RawSample raw = reader->next();
      if (std::binary_search(draws.begin(), draws.end(), k))
        read.emplace(std::make_pair(c, k), make_item(raw, cursor_.epoch, c, k));
    }
  }
  for (const auto& origin : mine) {
    Item item = std::move(read.at(origin));
    if (!item.error.empty()) {  // it decoded at the save; a shard changed since
      on_damaged(item);
      continue;
    }
    pending_[static_cast<size_t>(item.sample.bucket)].push_back(std::move(item));
  }
}

void ShardLoader::assembler_loop() {
  run_aten_serially_on_this_thread();
  try {
    for (;;) {
      if (cursor_.batches_left == 0) {  // the epoch ends: what is left in the streams is not used
        std::vector<int64_t> lengths, ended_lengths;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          ended_lengths = stream_lengths(cursor_.epoch);
          lengths = stream_lengths(cursor_.epoch + 1);
          queues_.erase(queues_.begin(), queues_.lower_bound({cursor_.epoch + 1, 0}));
          assembling_epoch_ = cursor_.epoch + 1;
        }
        space_cv_.notify_all();
        int64_t unused = 0;
        for (int64_t c = options_.rank; c < options_.streams; c += options_.world)
          unused += ended_lengths[static_cast<size_t>(c)] - cursor_.stream_counts[static_cast<size_t>(c)];
        if (unused > 0)
          options_.warn(fmt::format("rank {}: epoch {} ended with {} samples of its streams unused (streams of unequal "
                                    "length; see data.streams)",
                                    options_.rank, cursor_.epoch, unused));
        int64_t waiting = 0;
        for (auto& queue : pending_) {
          waiting += static_cast<int64_t>(queue.size());
          queue.clear();
        }
        if (waiting > 0)
          options_.warn(fmt::format("rank {}: epoch {} ended with {} samples waiting in buckets; they are not used",
                                    options_.rank, cursor_.epoch, waiting));
        cursor_.pending.clear();
        cursor_.epoch += 1;
        cursor_.position = 0;
        cursor_.stream_counts.assign(static_cast<size_t>(options_.streams), 0);
        cursor_.batches_left = batches_left_in_epoch(cursor_.stream_counts, lengths, options_.world, local_batch_);
        if (cursor_.batches_left == 0)
          throw DataError(fmt::format("epoch {} gives rank {} fewer than one batch of {} samples", cursor_.epoch,
                                      options_.rank, local_batch_));
      }
      std::vector<int64_t> lengths;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        lengths = stream_lengths(cursor_.epoch);
      }
      int64_t repeated = 0;
      std::vector<Item> items = gather_batch(lengths, repeated);
      std::vector<std::string> keys;
      std::vector<const DecodedSample*> samples;
      for (const auto& item : items) {
        samples.push_back(&item.sample);
        keys.push_back(item.key);
      }
      if (repeated > 0) {
        if (items.empty() && !last_sample_.image.defined() && last_sample_.fields.empty())
          throw DataError(fmt::format("rank {}: every sample left in its streams of epoch {} was damaged",
                                      options_.rank, cursor_.epoch));
        for (int64_t i = 0; i < repeated; ++i) {
          const size_t from = items.empty() ? 0 : static_cast<size_t>(i) % items.size();
          samples.push_back(items.empty() ? &last_sample_ : &items[from].sample);
          keys.push_back(items.empty() ? std::string("(repeat of the previous batch)") : items[from].key);
        }
        cursor_.repeated += repeated;
        options_.warn(fmt::format("rank {}: epoch {}: {} samples repeated to fill a batch after damaged samples were "
                                  "skipped",
                                  options_.rank, cursor_.epoch, repeated));
      }
      Batch batch = make_batch(samples);
      if (!items.empty()) last_sample_ = items.back().sample;
      batch.keys = std::move(keys);
      cursor_.pending.clear();
      for (const auto& queue : pending_)
        for (const auto& item : queue) {
          cursor_.pending.push_back(item.stream);
          cursor_.pending.push_back(item.emission);
        }
      --cursor_.batches_left;
      cursor_.keys_written += local_batch_;
      batch.state_after = cursor_;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        taken_cv_.wait(lock, [&] { return stopping_ || error_ || static_cast<int64_t>(ready_.size()) < options_.prefetch; });
        if (stopping_ || error_) return;
        ready_.push_back(std::move(batch));
      }
      ready_cv_.notify_all();
    }
  } catch (...) {
    bool quiet;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quiet = stopping_;
    }
    if (!quiet) fail(std::current_exception());
  }
}

Batch ShardLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_cv_.wait(lock, [&] { return error_ || !ready_.empty(); });
  if (!ready_.empty()) {  // batches made before an error are still good
    Batch batch = std::move(ready_.front());
    ready_.pop_front();
    consumed_ = batch.state_after;
    lock.unlock();
    taken_cv_.notify_all();
    return batch;
  }
  std::rethrow_exception(error_);
}

std::unique_ptr<StreamReader> ShardLoader::open_stream(const std::vector<std::vector<int64_t>>& plan, int64_t epoch,
                                                       int64_t stream, int64_t start) const {
  std::vector<std::string> entries;
  std::vector<int64_t> counts;
  for (int64_t s : plan[static_cast<size_t>(stream)]) {
    entries.push_back(options_.shards[static_cast<size_t>(s)]);
    counts.push_back(options_.shard_samples[static_cast<size_t>(s)]);
  }
  return std::make_unique<StreamReader>(std::move(entries), std::move(counts), options_.shuffle_buffer,
                                        stream_seed(options_.seed, epoch, stream), start, options_.fetch);
}

ShardLoader::Item ShardLoader::make_item(const RawSample& raw, int64_t epoch, int64_t stream, int64_t draw) const {
  Item item{raw.key, raw.shard, "", {}, stream, draw};
  try {
    item.sample = decode_sample(raw, options_.spec, draw_seed(epoch, stream, draw));
  } catch (const std::exception& e) {  // DataError, or a c10::Error from a malformed tensor
    item.error = e.what();
  }
  return item;
}

uint64_t ShardLoader::draw_seed(int64_t epoch, int64_t stream, int64_t draw) const {
  return splitmix64_mix(stream_seed(options_.seed, epoch, stream) ^ splitmix64_mix(static_cast<uint64_t>(draw)));
}

uint64_t ShardLoader::fingerprint() const {
  uint64_t h = 0x6A09E667F3BCC908ull;
  const auto mix = [&h](uint64_t v) { h = splitmix64_mix(h ^ (v + kGoldenGamma)); };
  for (size_t i = 0; i < options_.shards.size(); ++i) {
    // Base names: the same shards moved to another store (a path -> pipe:aws s3 cp …) still match.
    for (unsigned char ch : shard_basename(options_.shards[i])) mix(ch);
    mix(static_cast<uint64_t>(options_.shard_samples[i]));
  }
  for (int64_t v : {options_.streams, options_.shuffle_buffer}) mix(static_cast<uint64_t>(v));
  mix(options_.seed);
  return h;
}

LoaderState ShardLoader::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumed_;
}

}  // namespace flowtrain::data
