#include "trainer/checkpoint/staging.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace flowtrain::trainer {

namespace {
std::optional<c10::Device> cuda_device_of(const CheckpointContents& c) {
  for (const NamedTensors* part : {&c.model, &c.ema, &c.optimizer})
    for (const auto& [name, t] : *part)
      if (t.is_cuda()) return t.device();
  return std::nullopt;
}
}  // namespace

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
    staged.emplace_back(name, buffer);
  }
  return staged;
}

CheckpointContents CheckpointStager::stage(const CheckpointContents& c) {
  const std::optional<c10::Device> cuda = cuda_device_of(c);
  std::optional<c10::StreamGuard> on_side_stream;
  if (cuda) {
    const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    if (!side_stream_) side_stream_ = impl.getStreamFromGlobalPool(*cuda);
    // The copies start after everything the current stream has queued (the step that produced
    // this state), then run beside whatever it queues next.
    c10::Event produced(c10::DeviceType::CUDA);
    produced.record(impl.getStream(*cuda));
    produced.block(*side_stream_);
    on_side_stream.emplace(*side_stream_);
  }
  CheckpointContents staged;
  staged.model = stage_tensors("model", c.model);
  staged.ema = stage_tensors("ema", c.ema);
  staged.optimizer = stage_tensors("optimizer", c.optimizer);
  staged.rng = stage_tensors("rng", c.rng);
  staged.fp8 = stage_tensors("fp8", c.fp8);
  staged.progress = c.progress;
  staged.optimizer_step_count = c.optimizer_step_count;
  staged.config_yaml = c.config_yaml;
  staged.world_size = c.world_size;
  if (c.sharded) {
    ShardedContents sh = *c.sharded;
    sh.fixed = stage_tensors("fixed", c.sharded->fixed);
    staged.sharded = std::move(sh);
  }
  if (cuda) {
    copied_.emplace(c10::DeviceType::CUDA);
    copied_->record(*side_stream_);
  } else {
    copied_.reset();
  }
  return staged;
}

void CheckpointStager::before_state_update() {
  if (!copied_) return;
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  copied_->block(impl.getStream(side_stream_->device()));
}

void CheckpointStager::wait() {
  if (copied_) copied_->synchronize();
}

int64_t CheckpointStager::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& [key, buffer] : buffers_) total += static_cast<int64_t>(buffer.nbytes());
  return total;
}

}  // namespace flowtrain::trainer
