// The training data loader: background threads assemble batches into a bounded queue.
//
// Determinism and resume: the sample order of an epoch is a pure function of (seed, epoch)
// (a Fisher–Yates shuffle driven by splitmix64), and the loader's whole state is (epoch,
// position) = the number of samples of that epoch already handed out. A loader built from a
// saved state continues with exactly the batch the previous run would have produced next,
// whatever the number of worker threads. A global batch is split across data-parallel ranks by
// contiguous slices of the epoch order, so a rank's stream is a pure function of
// (seed, epoch, rank, world). The last incomplete global batch of an epoch is dropped.
#pragma once

#include "data/batch_source.h"
#include "data/image_dataset.h"

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace flowtrain::data {

struct LoaderOptions {
  int64_t global_batch = 64;  // samples per step over all ranks
  int64_t workers = 2;        // 0: assemble batches in the caller's thread
  int64_t prefetch = 4;       // batches ready ahead of the consumer (bounded queue)
  uint64_t seed = 0;
  int64_t rank = 0, world = 1;
  int64_t image_size = 0;     // pad (with −1 = black) to this side; 0 = keep the dataset's size
  // Batches in page-locked host memory (the workers pin them), so the trainer's host→device copy
  // is a DMA that runs asynchronously (non_blocking). Only for CUDA runs: pinning needs CUDA.
  bool pin_memory = false;
};

// uint8 images [N, C, H, W] (0…255) as the model sees them: float in [−1, 1], padded with −1
// (black) to image_size × image_size when that is larger (0: kept as they are).
at::Tensor model_input_images(const at::Tensor& images_u8, int64_t image_size);

// The epoch permutation of [0, n): a pure function of (seed, epoch).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

class Loader final : public BatchSource {
 public:
  Loader(std::shared_ptr<const ImageDataset> dataset, LoaderOptions options, LoaderState start = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  Batch next() override;
  LoaderState state() const override;

 private:
  struct Task { int64_t index; LoaderState start; };
  Task claim_task();                      // under mutex_
  Batch assemble(const LoaderState& start);
  void worker_loop();

  std::shared_ptr<const ImageDataset> dataset_;
  LoaderOptions options_;
  int64_t local_batch_;

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  LoaderState cursor_;                    // start of the next unclaimed batch
  LoaderState consumed_;                  // state after the last batch handed out
  int64_t next_task_ = 0, next_to_hand_out_ = 0;
  std::map<int64_t, Batch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;

  // The permutation of the most recent epoch, shared by workers (recomputed on epoch change).
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace flowtrain::data
