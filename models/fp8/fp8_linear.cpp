#include "models/fp8/fp8_linear.h"

#include "models/fp8/scaled_gemm.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <stdexcept>

namespace flowtrain::models::fp8 {

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum Operand : int64_t { kInput = 0, kWeight = 1, kGradOutput = 2 };

// The delayed-scaling inputs of one call, passed as one non-tensor argument: undefined tensors
// cannot be autograd inputs, and none of these needs a gradient.
struct ScaleArgs {
  at::Tensor history_amax;  // delayed: [3] amaxes of (x, W, ∂y) from the history; undefined = dynamic
  at::Tensor pending;       // delayed, training passes only: the [3] amax slots this call records into
  at::Tensor x_scale, w_scale;  // set inside the forward (tensor scaling), reused by backward
  at::Tensor w_fp8, w_inv_scale;  // fp8 all-gather: W already cast (e4m3, tensor scale); W's data unread
};

// The precast weight as an operand of the forward (W) or of ∂x's GEMM (Wᵀ: the same bytes and
// scale, transposed).
Quantized precast(const at::Tensor& data, const at::Tensor& inv_scale) {
  return {data, inv_scale, Format::e4m3, Scaling::tensor};
}

// The tensor scale of one operand, whose own amax is `amax`. Delayed scaling takes the history's
// amax instead — unless it is 0: blocks that start at zero (adaLN-Zero gates) see ∂y ≡ 0 at step
// 1, and a scale of max_finite/1e-12 from that would clip every non-zero ∂y of step 2 to ±max
// (finite, wrong, unnoticed). There, and before the first commit, the operand's own amax is
// used, as dynamic scaling would. Records `amax` into the pending slot on training passes.
at::Tensor operand_scale(const ScaleArgs& args, Operand which, const at::Tensor& amax, Format format) {
  if (args.pending.defined()) {
    at::Tensor slot = args.pending.select(0, which);
    slot.copy_(at::maximum(slot, amax.to(args.pending.device())));
  }
  if (!args.history_amax.defined()) return tensor_scale(amax, format);
  const at::Tensor h = args.history_amax.select(0, which).to(amax.device());
  return tensor_scale(at::where(h > 0, h, amax), format);
}

// x·Wᵀ through the recipe's GEMMs (the bias is added outside, by autograd). Saved for backward:
// x and W in their own precision (each backward GEMM re-quantises its operands along its own
// contracted axis) and the tensor-scaling scales of x and W (tensorwise/delayed backward reuse
// the forward's).
struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t recipe,
                            bool emulate, int64_t out_dtype, ScaleArgs scales) {
    // The emulation's matmuls run in fp32 whatever the surrounding autocast says.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const RecipePlan p = plan(static_cast<Recipe>(recipe));
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    if (p.output.a.scaling == Scaling::tensor) scales.x_scale = operand_scale(scales, kInput, abs_max(x2), p.output.a.format);
    GemmOperand w{weight, p.output.b};
    if (scales.w_fp8.defined()) w.cast_value = precast(scales.w_fp8, scales.w_inv_scale);
    else if (p.output.b.scaling == Scaling::tensor)
      w.scale = scales.w_scale = operand_scale(scales, kWeight, abs_max(weight), p.output.b.format);

    const at::Tensor y = scaled_gemm({x2, p.output.a, scales.x_scale}, w, p.output.fast_accum, emulate,
                                     static_cast<at::ScalarType>(out_dtype));
    ctx->save_for_backward({x, weight});
    ctx->saved_data["recipe"] = recipe;
    ctx->saved_data["emulate"] = emulate;
    ctx->saved_data["x_scale"] = scales.x_scale;
    ctx->saved_data["w_scale"] = scales.w_scale;
    ctx->saved_data["history_amax"] = scales.history_amax;
    ctx->saved_data["pending"] = scales.pending;
    ctx->saved_data["w_fp8"] = scales.w_fp8;
    ctx->saved_data["w_inv_scale"] = scales.w_inv_scale;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return y.view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const RecipePlan p = plan(static_cast<Recipe>(ctx->saved_data["recipe"].toInt()));
    const bool emulate = ctx->saved_data["emulate"].toBool();
    auto tensor_or_none = [&](const char* key) {
      const auto& v = ctx->saved_data[key];
      return v.isTensor() ? v.toTensor() : at::Tensor();
    };
    const at::Tensor x_scale = tensor_or_none("x_scale"), w_scale = tensor_or_none("w_scale");
    ScaleArgs delayed;
    delayed.history_amax = tensor_or_none("history_amax");
    delayed.pending = tensor_or_none("pending");

    const at::Tensor dy = grads[0].reshape({-1, weight.size(0)});
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    // One ∂y scale for both backward GEMMs (tensor scaling), as torchao and TE do.
    at::Tensor dy_scale;
    if (p.grad_input.a.scaling == Scaling::tensor && p.grad_input.a.fp8)
      dy_scale = operand_scale(delayed, kGradOutput, abs_max(dy), p.grad_input.a.format);

    at::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(0)) {
      // A precast weight's parameter has no data to take a view of: Wᵀ is the bytes' transpose.
      const at::Tensor w_fp8 = tensor_or_none("w_fp8");
      GemmOperand wt{w_fp8.defined() ? w_fp8.t() : weight.t(), p.grad_input.b, w_scale};
      if (w_fp8.defined()) wt.cast_value = precast(w_fp8.t(), tensor_or_none("w_inv_scale"));
      grad_x = scaled_gemm({dy, p.grad_input.a, dy_scale}, wt, false, emulate, x.scalar_type()).view(x.sizes());
    }
    if (ctx->needs_input_grad(1))
      grad_w = scaled_gemm({dy.t(), p.grad_weight.a, dy_scale}, {x2.t(), p.grad_weight.b, x_scale}, false, emulate,
                           weight.scalar_type());
    return {grad_x, grad_w, {}, {}, {}, {}};
  }
};

// The dtype at::linear would return for x: the autocast dtype inside an autocast region.
at::ScalarType output_dtype(const at::Tensor& x) {
  const auto device = x.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : x.scalar_type();
}
}  // namespace

Fp8Linear::Fp8Linear(Recipe recipe, bool emulate, DelayedOptions delayed)
    : recipe_(recipe), emulate_(emulate), delayed_(std::move(delayed)) {
  if (recipe_ == Recipe::none) throw std::invalid_argument("Fp8Linear: recipe none is the plain linear");
  if (delayed_.history_len < 1) throw std::invalid_argument("Fp8Linear: amax history length must be ≥ 1");
}

std::string Fp8Linear::describe() const {
  return std::string("fp8 ") + name(recipe_) + (emulate_ ? " (emulated)" : "");
}

at::Tensor Fp8Linear::history_amax(const c10::Device& device) {
  if (!pending_.defined() || pending_.device() != device) {
    pending_ = at::zeros({3}, at::TensorOptions().dtype(at::kFloat).device(device));
    // A restored history (on the CPU until the first call) follows the layer to its device.
    history_ = history_.defined() ? history_.to(device) : at::zeros({delayed_.history_len, 3}, pending_.options());
  }
  if (commits_ == 0) return {};
  const int64_t filled = std::min<int64_t>(commits_, delayed_.history_len);
  return delayed_.reduce == AmaxReduce::max ? std::get<0>(history_.narrow(0, 0, filled).max(0)) : history_[0];
}

void Fp8Linear::commit_amax(const at::Tensor& reduced) {
  if (!pending_.defined()) return;  // never called: nothing seen
  at::NoGradGuard no_grad;
  history_.copy_(at::cat({reduced.to(history_.device()).view({1, 3}), history_.narrow(0, 0, delayed_.history_len - 1)}));
  pending_.zero_();
  ++commits_;
}

void Fp8Linear::restore_amax_history(const at::Tensor& history, int64_t commits) {
  if (history.dim() != 2 || history.size(1) != 3 || commits < 0)
    throw std::invalid_argument("Fp8Linear: an amax history is [rows, 3] with commits >= 0, got " +
                                std::to_string(history.dim()) + " dims and " + std::to_string(commits) + " commits");
  const c10::Device device = history_.defined() ? history_.device() : c10::Device(c10::kCPU);
  at::Tensor restored = at::zeros({delayed_.history_len, 3}, at::TensorOptions().dtype(at::kFloat).device(device));
  const int64_t rows = std::min({history.size(0), delayed_.history_len, commits});
  restored.narrow(0, 0, rows).copy_(history.narrow(0, 0, rows));
  history_ = restored;
  if (pending_.defined()) pending_.zero_();
  commits_ = rows == delayed_.history_len ? commits : rows;  // only rows that hold real amaxes count
}

std::shared_ptr<PrecastWeight> Fp8Linear::gather_weight_in_fp8() {
  if (recipe_ != Recipe::tensorwise)
    throw std::invalid_argument(std::string("fp8 all-gather casts each weight with one tensor scale: recipe tensorwise "
                                            "only, not ") + name(recipe_));
  if (!precast_) precast_ = std::make_shared<PrecastWeight>();
  return precast_;
}

at::Tensor Fp8Linear::linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  ScaleArgs scales;
  if (recipe_ == Recipe::delayed) {
    scales.history_amax = history_amax(x.device());
    // Only training passes feed the history: a sample grid's or an evaluation's forward (no
    // grad, EMA weights, other noise levels) must not move the next step's scales. Under
    // activation checkpointing the no-grad first pass records nothing and the recompute does.
    if (at::GradMode::is_enabled()) scales.pending = pending_;
  }
  if (precast_) {
    TORCH_CHECK(precast_->data.defined(), "fp8 all-gather: a ", describe(),
                " linear ran before its weight was gathered (FSDP's begin_forward / unit schedule)");
    scales.w_fp8 = precast_->data;
    scales.w_inv_scale = precast_->inv_scale;
  }
  const at::ScalarType dtype = output_dtype(x);
  const at::Tensor y =
      Fp8LinearFunction::apply(x, weight, static_cast<int64_t>(recipe_), emulate_, static_cast<int64_t>(dtype), scales);
  return bias.defined() ? y + bias.to(dtype) : y;
}

}  // namespace flowtrain::models::fp8
