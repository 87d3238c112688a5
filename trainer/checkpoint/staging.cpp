#include "trainer/checkpoint/staging.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace flowtrain::trainer {

namespace {
// Every part of a checkpoint that holds tensors, with the name its staging buffers are kept under.
// `Contents` is CheckpointContents, const or not: stage() replaces the parts, reserve() reads them.
template <typename Contents, typename Fn>
void for_each_tensor_part(Contents& c, Fn&& fn) {
  fn("model", c.model);
  fn("ema", c.ema);
  fn("optimizer", c.optimizer);
  fn("rng", c.rng);
  fn("fp8", c.fp8);
  if (c.sharded) fn("fixed", c.sharded->fixed);
}

std::optional<c10::Device> cuda_device_of(const CheckpointContents& c) {
  std::optional<c10::Device> device;
  for_each_tensor_part(c, [&](const std::string&, const NamedTensors& tensors) {
    for (const auto& [name, t] : tensors)
      if (!device && t.is_cuda()) device = t.device();
  });
  return device;
}
}  // namespace

at::Tensor& CheckpointStager::buffer_for(const std::string& key, const at::Tensor& source, bool* fresh) {
  at::Tensor& buffer = buffers_[key];
  const bool fits = buffer.defined() && buffer.sizes() == source.sizes() && buffer.dtype() == source.dtype();
  if (!fits) {
    // First use (or a shape that changed, which a run does not do): allocate once. Pinned host
    // memory lets the device-to-host copy run asynchronously.
    buffer = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(source.is_cuda()));
  }
  if (fresh) *fresh = !fits;
  return buffer;
}

NamedTensors CheckpointStager::stage_tensors(const std::string& kind, const NamedTensors& tensors) {
  NamedTensors staged;
  staged.reserve(tensors.size());
  for (const auto& [name, source] : tensors) {
    at::Tensor& buffer = buffer_for(kind + "/" + name, source);
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
  CheckpointContents staged = c;  // progress, config, layout as they are; the tensors replaced below
  for_each_tensor_part(staged, [&](const std::string& kind, NamedTensors& tensors) {
    tensors = stage_tensors(kind, tensors);
  });
  if (cuda) {
    copied_.emplace(c10::DeviceType::CUDA);
    copied_->record(*side_stream_);
  } else {
    copied_.reset();
  }
  return staged;
}

void CheckpointStager::reserve(const CheckpointContents& c) {
  for_each_tensor_part(c, [&](const std::string& kind, const NamedTensors& tensors) {
    for (const auto& [name, source] : tensors) {
      bool fresh = false;
      at::Tensor& buffer = buffer_for(kind + "/" + name, source, &fresh);
      // Writing every page now is what makes the first save's copy as fast as a later one's
      // (pinned buffers are resident already; zeroing them is cheap next to faulting pages).
      if (fresh) buffer.zero_();
    }
  });
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
