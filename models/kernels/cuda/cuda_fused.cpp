// The differentiable wrappers of the fused CUDA kernels (launchers in launch.h, kernels in the .cu
// files beside it) and the operand checks. Dtype casts and layout fixes happen outside the
// autograd Functions, as ordinary differentiable ATen ops, so each Function sees exactly the
// operands its kernels take and returns gradients for them.
#include "models/kernels/cuda/cuda_fused.h"

#include "models/kernels/cuda/launch.h"

#include <torch/csrc/autograd/custom_function.h>

namespace flowtrain::models::cuda_fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxGridYZ = 65535;
constexpr int64_t kMaxGridX = (int64_t(1) << 31) - 1;
// Sizes the launchers pass to the kernels as int (a row's length, a tensor's row count).
constexpr int64_t kMaxInt = (int64_t(1) << 31) - 1;

bool kernel_dtype(const at::Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  return s == at::kFloat || s == at::kBFloat16 || s == at::kHalf;
}
// A CUDA tensor on x's device of a dtype the kernels take.
bool kernel_operand(const at::Tensor& t, const at::Tensor& x) {
  return t.defined() && t.is_cuda() && t.device() == x.device() && kernel_dtype(t);
}
// A floating tensor on x's device (cast to a kernel dtype by the wrapper).
bool cast_operand(const at::Tensor& t, const at::Tensor& x) {
  return t.defined() && t.is_cuda() && t.device() == x.device() && at::isFloatingType(t.scalar_type());
}
// v's dtype promotes with x's to x's (the ATen composition's result dtype), so casting v to x's
// dtype loses nothing and the output keeps the composition's dtype: fp32 x takes bf16/fp16 v
// (exact upcast); bf16 x with fp32 v (the composition returns fp32, and v and its gradient would
// be rounded to bf16) or fp16 x with bf16 v (the composition promotes to fp32; the cast could
// overflow fp16) are left to ATen.
bool promotes_to_x(const at::Tensor& v, const at::Tensor& x) {
  const at::ScalarType s = v.scalar_type(), xs = x.scalar_type();
  return s == xs || (xs == at::kFloat && (s == at::kBFloat16 || s == at::kHalf));
}
// [B, D] per-sample rows of x [B, N, D].
bool per_sample(const at::Tensor& v, const at::Tensor& x) {
  return cast_operand(v, x) && promotes_to_x(v, x) && v.dim() == 2 && v.size(0) == x.size(0) &&
         v.size(1) == x.size(2);
}

// The per-sample vector in x's dtype with unit inner stride (the kernels take a row stride).
at::Tensor as_rows(const at::Tensor& v, const at::Tensor& x) {
  at::Tensor r = v.scalar_type() == x.scalar_type() ? v : v.to(x.scalar_type());
  return r.stride(1) == 1 ? r : r.contiguous();
}

at::Tensor fp32_rows_like(const at::Tensor& x, at::IntArrayRef sizes) {
  return at::empty(sizes, x.options().dtype(at::kFloat));
}

struct AdaLNModulateFn : torch::autograd::Function<AdaLNModulateFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& shift,
                            const at::Tensor& scale, double eps) {
    const at::Tensor x = x_in.contiguous();
    const int64_t B = x.size(0), N = x.size(1);
    at::Tensor y = at::empty_like(x);
    at::Tensor mean = fp32_rows_like(x, {B * N}), rstd = fp32_rows_like(x, {B * N});
    launch::adaln_forward(x, shift, scale, eps, y, mean, rstd);
    ctx->save_for_backward({x, mean, rstd, scale});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &rstd = saved[2], &scale = saved[3];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dx = at::empty_like(x);
    const auto [dshift, dscale] = launch::adaln_backward(g, x, mean, rstd, scale, dx);
    return {dx, dshift.to(x.scalar_type()), dscale.to(x.scalar_type()), at::Tensor()};
  }
};

struct GatedResidualFn : torch::autograd::Function<GatedResidualFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate,
                            const at::Tensor& y_in) {
    const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
    at::Tensor out = at::empty_like(x);
    launch::gated_forward(x, gate, y, out);
    ctx->save_for_backward({gate, y});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &y = saved[1];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dy = at::empty_like(y);
    const at::Tensor dgate = launch::gated_backward(g, gate, y, dy);
    return {grads[0], dgate.to(y.scalar_type()), dy};
  }
};

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& angles) {
    const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
    at::Tensor out = at::empty(x.sizes(), x.options());
    launch::rope(x, angles, /*inverse=*/false, out);
    ctx->save_for_backward({angles});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor angles = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].stride(3) == 1 ? grads[0] : grads[0].contiguous();
    at::Tensor dx = at::empty(g.sizes(), g.options());
    launch::rope(g, angles, /*inverse=*/true, dx);  // the rotation's transpose
    return {dx, at::Tensor()};
  }
};

struct QkRmsNormFn : torch::autograd::Function<QkRmsNormFn> {
  // x [B, H, L, Dh] with unit stride on Dh, weight [Dh] fp32 contiguous.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor rrms = fp32_rows_like(x, {x.numel() / x.size(3)});
    launch::rmsnorm_forward(x, weight, eps, y, rrms);
    ctx->save_for_backward({x, weight, rrms});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rrms = saved[2];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    return {dx, launch::rmsnorm_backward(g, x, weight, rrms, dx), at::Tensor()};
  }
};

bool fp8_dtype_ok(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

}  // namespace

// ---- the differentiable ops --------------------------------------------------------------------

bool supports_adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return kernel_operand(x, x) && x.dim() == 3 && x.size(2) <= launch::kMaxRowElements && x.size(0) <= kMaxGridYZ &&
         x.size(0) * x.size(1) <= kMaxGridX && per_sample(shift, x) && per_sample(scale, x);
}

at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  TORCH_CHECK(supports_adaln_modulate(x, shift, scale), "cuda_fused::adaln_modulate: unsupported operands ",
              x.sizes(), " ", x.scalar_type(), " ", x.device());
  return AdaLNModulateFn::apply(x, as_rows(shift, x), as_rows(scale, x), eps);
}

bool supports_gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return kernel_operand(x, x) && x.dim() == 3 && kernel_operand(y, x) && y.scalar_type() == x.scalar_type() &&
         y.sizes() == x.sizes() && x.size(0) <= kMaxGridYZ && x.size(0) * x.size(1) <= kMaxGridX &&
         x.size(2) <= kMaxInt && per_sample(gate, x);
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  TORCH_CHECK(supports_gated_residual(x, gate, y), "cuda_fused::gated_residual: unsupported operands ", x.sizes(),
              " ", x.scalar_type(), " ", x.device());
  return GatedResidualFn::apply(x, as_rows(gate, x), y);
}

bool supports_rope(const at::Tensor& x, const at::Tensor& angles) {
  if (!kernel_operand(x, x) || x.dim() != 4 || !cast_operand(angles, x) || angles.dim() != 4) return false;
  const int64_t B = x.size(0), H = x.size(1), L = x.size(2), Dh = x.size(3);
  return Dh % 2 == 0 && Dh <= 1024 && B <= kMaxGridYZ && H <= kMaxGridYZ && (angles.size(0) == 1 || angles.size(0) == B) &&
         angles.size(1) == L && angles.size(2) * 2 == Dh && angles.size(3) == 2;
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& angles) {
  TORCH_CHECK(supports_rope(x, angles), "cuda_fused::apply_rope: unsupported operands ", x.sizes(), " ",
              angles.sizes(), " ", x.scalar_type(), " ", x.device());
  return RopeFn::apply(x, angles.detach().to(at::kFloat).contiguous());
}

bool supports_qk_rmsnorm(const at::Tensor& x, const at::Tensor& weight) {
  return kernel_operand(x, x) && x.dim() >= 1 && x.size(-1) >= 1 && x.size(-1) <= 256 && cast_operand(weight, x) &&
         weight.dim() == 1 && weight.size(0) == x.size(-1) && x.numel() / x.size(-1) <= kMaxInt;  // rows as int
}

at::Tensor qk_rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(supports_qk_rmsnorm(x, weight), "cuda_fused::qk_rmsnorm: unsupported operands ", x.sizes(), " ",
              x.scalar_type(), " ", x.device());
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  // The kernels walk rows (b, h, l) of a 4-D tensor with any strides but the last; anything else
  // is viewed (or copied) as [1, 1, rows, Dh].
  if (x.dim() == 4 && x.stride(3) == 1) return QkRmsNormFn::apply(x, w, eps);
  const at::Tensor rows = x.reshape({1, 1, -1, x.size(-1)});
  // clone, not contiguous(): with Dh = 1 a tensor may count as contiguous (size-1 dims' strides
  // are ignored) and keep stride(3) ≠ 1, which the launchers reject.
  const at::Tensor r = rows.stride(3) == 1 ? rows : rows.clone(at::MemoryFormat::Contiguous);
  return QkRmsNormFn::apply(r, w, eps).view(x.sizes());
}

// ---- fp8 casts -----------------------------------------------------------------------------------

bool supports_fp8_cast(const at::Tensor& x) { return kernel_operand(x, x); }

at::Tensor amax(const at::Tensor& x) {
  TORCH_CHECK(supports_fp8_cast(x), "cuda_fused::amax: a CUDA fp32/bf16/fp16 tensor expected");
  at::Tensor out = at::empty({}, x.options().dtype(at::kFloat));
  launch::amax(x.contiguous(), out);
  return out;
}

at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8_dtype,
                       const at::Tensor& amax_out) {
  TORCH_CHECK(supports_fp8_cast(x) && fp8_dtype_ok(fp8_dtype), "cuda_fused::cast_to_fp8: a CUDA fp32/bf16/fp16 "
              "tensor and Float8_e4m3fn / Float8_e5m2 expected");
  TORCH_CHECK(scale.numel() == 1, "cuda_fused::cast_to_fp8: a one-element scale expected");
  TORCH_CHECK(!amax_out.defined() || (amax_out.device() == x.device() && amax_out.scalar_type() == at::kFloat &&
                                      amax_out.numel() == 1),
              "cuda_fused::cast_to_fp8: amax_out must be one fp32 element on x's device");
  const at::Tensor s = scale.to(x.device(), at::kFloat).reshape({}).contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(fp8_dtype));
  launch::cast_to_fp8(x.contiguous(), s, fp8_dtype == at::kFloat8_e4m3fn, out, amax_out);
  return out;
}

bool supports_rowwise_cast_to_fp8(const at::Tensor& x) {
  return kernel_operand(x, x) && x.dim() == 2 && x.size(0) <= kMaxGridX && x.size(1) <= kMaxInt;
}

std::pair<at::Tensor, at::Tensor> rowwise_cast_to_fp8(const at::Tensor& x, at::ScalarType fp8_dtype) {
  TORCH_CHECK(supports_rowwise_cast_to_fp8(x) && fp8_dtype_ok(fp8_dtype),
              "cuda_fused::rowwise_cast_to_fp8: a 2-D CUDA fp32/bf16/fp16 tensor and Float8_e4m3fn / "
              "Float8_e5m2 expected");
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(fp8_dtype));
  at::Tensor inv_scale = at::empty({x.size(0), 1}, x.options().dtype(at::kFloat));
  launch::rowwise_cast_to_fp8(x.contiguous(), fp8_dtype == at::kFloat8_e4m3fn, out, inv_scale);
  return {out, inv_scale};
}

bool supports_mx_block_cast_to_fp8(const at::Tensor& x) {
  return kernel_operand(x, x) && x.dim() == 2 && x.size(1) % 32 == 0;
}

std::pair<at::Tensor, at::Tensor> mx_block_cast_to_fp8(const at::Tensor& x, fp8_reference::MxExponent rule) {
  TORCH_CHECK(supports_mx_block_cast_to_fp8(x),
              "cuda_fused::mx_block_cast_to_fp8: a 2-D CUDA fp32/bf16/fp16 tensor with K % 32 == 0 expected");
  at::Tensor out = at::empty(x.sizes(), x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor exponents = at::empty({x.size(0), x.size(1) / 32}, x.options().dtype(at::kByte));
  launch::mx_block_cast_to_fp8(x.contiguous(), rule == fp8_reference::MxExponent::rceil, out, exponents);
  return {out, exponents};
}

}  // namespace flowtrain::models::cuda_fused
