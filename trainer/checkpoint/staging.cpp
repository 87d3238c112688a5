#include "trainer/checkpoint/staging.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <fmt/format.h>

namespace flowtrain::trainer {

NamedTensors CheckpointStager::stage_tensors(const std::string& kind, const NamedTensors& tensors) {
  NamedTensors staged;
  staged.reserve(tensors.size());
  for (const auto& [name, source] : tensors) {
    at::Tensor& buffer = buffers_[kind + "/" + name];
    const bool fits = buffer.defined() && buffer.sizes() == source.sizes() && buffer.dtype() == source.dtype();
    if (!fits) {
      // First save (or a shape that changed, which a run does not do): allocate once. Pinned
      // host memory lets the device-to-host copy run asynchronously.
      buffer = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(source.is_cuda()));
    }
    buffer.copy_(source.detach(), /*non_blocking=*/source.is_cuda());
    if (source.is_cuda()) cuda_device_ = source.device().index();
    staged.emplace_back(name, buffer);
  }
  return staged;
}

CheckpointContents CheckpointStager::stage(const CheckpointContents& c) {
  CheckpointContents staged;
  staged.model = stage_tensors("model", c.model);
  staged.ema = stage_tensors("ema", c.ema);
  staged.optimizer = stage_tensors("optimizer", c.optimizer);
  staged.rng = stage_tensors("rng", c.rng);
  staged.progress = c.progress;
  staged.optimizer_step_count = c.optimizer_step_count;
  staged.config_yaml = c.config_yaml;
  staged.world_size = c.world_size;
  if (c.sharded) {
    ShardedContents sh = *c.sharded;
    sh.fixed = stage_tensors("fixed", c.sharded->fixed);
    staged.sharded = std::move(sh);
  }
  return staged;
}

void CheckpointStager::wait() {
  if (cuda_device_ < 0) return;
  // The copies were issued on the current stream: waiting for the device orders them before the
  // host reads the buffers. (A side stream with an event, so that the next forward overlaps the
  // copy, is the CUDA refinement this leaves for later.)
  // Through the device-guard registry: this file needs no CUDA headers and builds without CUDA.
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->synchronizeDevice(cuda_device_);
  cuda_device_ = -1;
}

int64_t CheckpointStager::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& [key, buffer] : buffers_) total += static_cast<int64_t>(buffer.nbytes());
  return total;
}

}  // namespace flowtrain::trainer
