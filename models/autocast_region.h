// An autocast region for one device type, as PyTorch's `torch.autocast` context manager does it:
// on entry, autocast on with `dtype` (nothing happens when `enabled` is false); on exit, the
// previous state back, and the cast cache cleared when the outermost region ends (the cache
// holds low-precision copies of weights, which the optimizer step is about to change).
// Used for the bf16 forward (trainer) and for the activation-checkpoint recompute, which runs in
// backward, outside the forward's region, and must compute the same function.
#pragma once

#include <ATen/autocast_mode.h>

namespace flowtrain::models {

class AutocastRegion {
 public:
  AutocastRegion(bool enabled, c10::DeviceType device, at::ScalarType dtype = at::kBFloat16)
      : enabled_(enabled), device_(device) {
    if (!enabled_) return;
    previous_ = at::autocast::is_autocast_enabled(device_);
    previous_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_dtype(device_, dtype);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::increment_nesting();
  }
  ~AutocastRegion() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, previous_);
    at::autocast::set_autocast_dtype(device_, previous_dtype_);
  }
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  bool enabled_;
  c10::DeviceType device_;
  bool previous_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

}  // namespace flowtrain::models
