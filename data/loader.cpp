#include "data/loader.h"

#include "data/splitmix64.h"

#include "data/data_error.h"
#include "data/serial_thread.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <numeric>

namespace flowtrain::data {

at::Tensor model_input_images(const at::Tensor& images_u8, int64_t image_size) {
  at::Tensor images = images_u8.to(at::kFloat).div_(127.5).sub_(1.0);  // uint8 0..255 -> [−1, 1]
  const int64_t side = images.size(-1);
  if (image_size > side) {  // pads the last two dimensions: images and clips alike
    const int64_t before = (image_size - side) / 2, after = image_size - side - before;
    images = at::constant_pad_nd(images, {before, after, before, after}, -1.0);
  }
  return images;
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  SplitMix64 rng{seed * 0x100000001B3ull ^ (static_cast<uint64_t>(epoch) + 0x51ED27ull)};
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(static_cast<uint64_t>(i) + 1)]);
  return order;
}

ImageDataset make_synthetic_dataset(int64_t n, int64_t channels, int64_t side, int64_t num_classes, uint64_t seed,
                                    int64_t frames) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  ImageDataset d;
  const std::vector<int64_t> shape = frames > 1 ? std::vector<int64_t>{n, frames, channels, side, side}
                                                : std::vector<int64_t>{n, channels, side, side};
  d.images = at::randint(0, 256, shape, gen, at::TensorOptions().dtype(at::kByte));
  d.labels = at::randint(0, num_classes, {n}, gen, at::TensorOptions().dtype(at::kLong));
  d.num_classes = num_classes;
  return d;
}

Loader::Loader(std::shared_ptr<const ImageDataset> dataset, LoaderOptions options, LoaderState start)
    : dataset_(std::move(dataset)), options_(options), cursor_(start), consumed_(start) {
  if (options_.global_batch % options_.world != 0)
    throw DataError(fmt::format("data.batch_size {} is not divisible by the {} data-parallel ranks",
                                options_.global_batch, options_.world));
  if (dataset_->size() < options_.global_batch)
    throw DataError(fmt::format("the data set has {} samples, fewer than one batch of {}", dataset_->size(),
                                options_.global_batch));
  if (start.position < 0 || start.position > dataset_->size() || start.epoch < 0)
    throw DataError(fmt::format("loader state (epoch {}, position {}) is outside a data set of {} samples",
                                start.epoch, start.position, dataset_->size()));
  const int64_t side = dataset_->images.size(-1);  // square images or frames
  if (options_.image_size != 0 && options_.image_size < side)
    throw DataError(fmt::format("model.image_size {} is smaller than the data's {}×{} images", options_.image_size,
                                side, side));
  local_batch_ = options_.global_batch / options_.world;
  for (int64_t i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  space_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_) t.join();
}


LoaderState Loader::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consumed_;
}

Loader::Task Loader::claim_task() {
  if (cursor_.position + options_.global_batch > dataset_->size()) cursor_ = {cursor_.epoch + 1, 0};
  Task task{next_task_++, cursor_};
  cursor_.position += options_.global_batch;
  return task;
}

Batch Loader::assemble(const LoaderState& start) {
  std::shared_ptr<const std::vector<int64_t>> order;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (order_epoch_ != start.epoch) {
      order_ = std::make_shared<const std::vector<int64_t>>(epoch_order(dataset_->size(), options_.seed, start.epoch));
      order_epoch_ = start.epoch;
    }
    order = order_;
  }
  // This rank's contiguous slice of the global batch.
  const int64_t first = start.position + options_.rank * local_batch_;
  at::Tensor index = at::empty({local_batch_}, at::TensorOptions().dtype(at::kLong));
  auto* idx = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < local_batch_; ++i) idx[i] = (*order)[first + i];

  Batch batch;
  // uint8 0..255 -> [−1, 1]
  const at::Tensor rows = dataset_->images.index_select(0, index);
  // Float images are the model's inputs already (a set encoded once through the autoencoder).
  batch.images = rows.is_floating_point() ? rows : model_input_images(rows, options_.image_size);
  batch.labels = dataset_->labels.index_select(0, index);
  for (const auto& [name, field] : dataset_->fields) batch.fields[name] = field.index_select(0, index);
  if (options_.pin_memory) {
    batch.images = batch.images.pin_memory();
    batch.labels = batch.labels.pin_memory();
    for (auto& [name, field] : batch.fields) field = field.pin_memory();
  }
  batch.state_after = {start.epoch, start.position + options_.global_batch};
  return batch;
}

void Loader::worker_loop() {
  // Batches are small: one thread each is plenty, and an OpenMP team per worker would slow
  // the training step's own team (data/serial_thread.h).
  run_aten_serially_on_this_thread();
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_cv_.wait(lock, [&] { return stopping_ || next_task_ < next_to_hand_out_ + options_.prefetch; });
      if (stopping_) return;
      task = claim_task();
    }
    try {
      Batch batch = assemble(task.start);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(task.index, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    ready_cv_.notify_all();
  }
}

Batch Loader::next() {
  if (threads_.empty()) {  // synchronous mode
    Task task;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task = claim_task();
      ++next_to_hand_out_;
    }
    Batch batch = assemble(task.start);
    std::lock_guard<std::mutex> lock(mutex_);
    consumed_ = batch.state_after;
    return batch;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ready_cv_.wait(lock, [&] { return error_ || ready_.count(next_to_hand_out_); });
  if (error_) std::rethrow_exception(error_);
  auto node = ready_.extract(next_to_hand_out_++);
  consumed_ = node.mapped().state_after;
  lock.unlock();
  space_cv_.notify_all();
  return std::move(node.mapped());
}

}  // namespace flowtrain::data
