#include "trainer/optimizer.h"

#include <cmath>

namespace flowtrain::trainer {

double LrSchedule::lr_at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
  if (kind == ScheduleKind::constant) return peak_lr;
  // cosine over the steps after warmup
  const double span = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, double(step - warmup_steps) / span);
  const double min_lr = peak_lr * min_lr_ratio;
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const std::vector<std::pair<std::string, at::Tensor>>& named_params, AdamWOptions options)
    : options_(options) {
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;  // fixed tables (pos_embed) are not optimised
    TORCH_CHECK(p.scalar_type() == at::kFloat, "AdamW: master weight ", name, " must be fp32");
    slots_.push_back({name, p, at::zeros_like(p), at::zeros_like(p)});
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_count_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  // Slots whose tensors suit ATen's fused AdamW kernel (contiguous, same dtype and device as the
  // first such slot) are updated by one at::_fused_adamw_ call; the rest by the per-tensor loop.
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<const Slot*> looped;
  for (const auto& s : slots_) {
    const at::Tensor& g = s.param.grad();
    if (!g.defined()) continue;
    const bool fusable = s.param.is_contiguous() && g.is_contiguous() && s.exp_avg.is_contiguous() &&
                         s.exp_avg_sq.is_contiguous() && g.scalar_type() == s.param.scalar_type() &&
                         g.device() == s.param.device() &&
                         (params.empty() || (s.param.device() == params[0].device() &&
                                             s.param.scalar_type() == params[0].scalar_type()));
    if (!fusable) {
      looped.push_back(&s);
      continue;
    }
    params.push_back(s.param);
    grads.push_back(g);
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  if (!params.empty()) {
    // The kernel reads the step (for the bias corrections) from one fp32 scalar tensor per param,
    // on their device; the same tensor serves them all. Per element it computes, in fp32, the same
    // operations in the same order as the loop below: p·(1 − lr·λ); m ← m + (1−β1)·(g − m) (lerp);
    // v ← β2·v + (1−β2)·g·g; p ← p − (lr/bias1)·m / (√v / √bias2 + ε).
    if (!step_tensor_.defined() || step_tensor_.device() != params[0].device())
      step_tensor_ = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(params[0].device()));
    step_tensor_.fill_(double(step_count_));
    const std::vector<at::Tensor> steps(params.size(), step_tensor_);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, b1, b2,
                      options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  if (looped.empty()) return;
  const double bias1 = 1.0 - std::pow(b1, double(step_count_));
  const double bias2 = 1.0 - std::pow(b2, double(step_count_));
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  for (const Slot* s : looped) {
    const at::Tensor& g = s->param.grad();
    // Decoupled weight decay: p ← p·(1 − lr·λ), before the Adam update (torch.optim.AdamW order).
    if (options_.weight_decay != 0) s->param.mul_(1.0 - lr * options_.weight_decay);
    s->exp_avg.lerp_(g, 1.0 - b1);                               // m ← β1·m + (1−β1)·g
    s->exp_avg_sq.mul_(b2).addcmul_(g, g, 1.0 - b2);             // v ← β2·v + (1−β2)·g²
    at::Tensor denom = (s->exp_avg_sq.sqrt() / bias2_sqrt).add_(options_.eps);
    s->param.addcdiv_(s->exp_avg, denom, -step_size);            // p ← p − lr·m̂/(√v̂ + ε)
  }
}

void AdamW::zero_grad() {
  for (auto& s : slots_) {
    if (s.param.grad().defined()) s.param.mutable_grad() = at::Tensor();
  }
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, at::Tensor* per_param) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> with_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined()) continue;
    grads.push_back(params[i].grad());
    with_grad.push_back(static_cast<int64_t>(i));
  }
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  // fp32 norm of each gradient, then the norm of those: torch.nn.utils.clip_grad_norm_'s order.
  // The _foreach ops are one multi-tensor kernel on CUDA and the per-tensor loop on the CPU.
  const at::Tensor norms = at::stack(at::_foreach_norm(grads, 2, at::kFloat));
  at::Tensor total = at::linalg_vector_norm(norms, 2);
  if (per_param) {
    *per_param = grads.size() == params.size()
                     ? norms
                     : at::zeros({static_cast<int64_t>(params.size())}, norms.options())
                           .index_copy_(0, at::tensor(with_grad).to(norms.device()), norms);
  }
  if (max_norm > 0) at::_foreach_mul_(grads, clip_coefficient(total, max_norm));
  return total;
}

at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm) {
  at::Tensor coef = at::clamp_max(max_norm / (norm + 1e-6), 1.0);
  return at::where(at::isfinite(norm), coef, at::ones_like(coef));
}

}  // namespace flowtrain::trainer
