// AdamW with decoupled weight decay (Loshchilov & Hutter), fp32 state, and the learning-rate
// schedule (linear warmup, then constant or cosine). Written out rather than taken from
// torch::optim so that its state is plain named tensors: the checkpoint stores them as
// safetensors, and the sharded trainer (FSDP) will hold the same state for its shards only.
#pragma once

#include "trainer/config/config.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace flowtrain::trainer {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

struct LrSchedule {
  double peak_lr = 1e-4;
  int64_t warmup_steps = 0;
  ScheduleKind kind = ScheduleKind::constant;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;
  // lr for optimizer step `step` (0-based): warmup (step+1)/warmup·peak, then constant or
  // cosine from peak down to peak·min_lr_ratio at total_steps.
  double lr_at(int64_t step) const;
};

class AdamW {
 public:
  struct Slot {
    std::string name;
    at::Tensor param;    // fp32 master weight, updated in place
    at::Tensor exp_avg;  // m, fp32
    at::Tensor exp_avg_sq;  // v, fp32
  };

  AdamW(const std::vector<std::pair<std::string, at::Tensor>>& named_params, AdamWOptions options);

  // One update with learning rate `lr` from the params' current .grad(); params without a
  // gradient are skipped (their state is untouched), as torch.optim does.
  void step(double lr);
  void zero_grad();

  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }

 private:
  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t step_count_ = 0;
  at::Tensor step_tensor_;  // step_count_ as an fp32 scalar on the params' device (fused kernel)
};

// Global L2 norm of all gradients (computed in fp32, on the device: no host sync), and scales
// them in place by min(1, max_norm / (norm + 1e-6)) when max_norm > 0. Returns the norm before
// clipping. Non-finite norms are returned unchanged and nothing is scaled (the caller decides).
// `per_param` (optional) receives each parameter's gradient norm, [params.size()], 0 for a
// parameter without a gradient: the health check names the first non-finite one from it.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, at::Tensor* per_param = nullptr);

// The clip rule, one place for both train states: scale gradients by
// clamp(max_norm / (norm + 1e-6), max = 1), and by 1 when the norm is not finite, so a NaN step is
// left for the trainer's non-finite policy instead of being silently zeroed. `norm`: a scalar.
at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm);

}  // namespace flowtrain::trainer
