#pragma once
// Fused CUDA kernels for the memory-bound passes of DiT / Flux blocks and for fp8 casts, each
// one pass over memory each way where ATen runs 2–6 kernels (and saves their intermediates).
// Kernels in kernels/cuda/*.cu, autograd in cuda_fused.cpp; their CPU references are the ATen
// compositions named below and models/kernels/fp8_cast_reference.h
// (tests/fused_op_table.h, tests/gpu/test_cuda_fused.cpp; benchmark bench/kernel_bench.cpp).
//
// Built only with FLOWTRAIN_CUDA: flowtrain_models then defines FLOWTRAIN_HAVE_CUDA_KERNELS=1
// for itself and its users. Without it this header still compiles: every supports_* is false and
// the ops throw, so callers may test supports_* alone or `#if FLOWTRAIN_HAVE_CUDA_KERNELS`.
//
// The differentiable ops (adaln_modulate, gated_residual, apply_rope, qk_rmsnorm) compute in
// fp32 and round once to the output dtype; their backward passes are fused kernels too (not
// twice differentiable). Inputs must satisfy the matching supports_* (else use the ATen path):
// CUDA tensors on one device, fp32 / bf16 / fp16. Token tensors that are not contiguous are
// copied first; per-sample vectors may be strided rows (chunks of the adaLN linear's output).
#include "models/kernels/fp8_cast_reference.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <utility>

namespace flowtrain::models::cuda_fused {

#if defined(FLOWTRAIN_HAVE_CUDA_KERNELS)

// x [B, N, D], shift, scale [B, D] of x's dtype, or bf16/fp16 when x is fp32 (cast to x's, a
// differentiable cast; a dtype that would promote x's, e.g. fp32 with bf16 x, is rejected);
// D ≤ 4096 (the row lives in registers), B ≤ 65535.
bool supports_adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);
// LayerNorm(x, no affine, eps)·(1 + scale) + shift, in x's dtype; saves x and per-token μ, σ⁻¹
// (fp32). = at::layer_norm(x, {D}, {}, {}, eps) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1).
at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

// x, y [B, N, D] of one dtype, gate [B, D] (cast to x's dtype; as adaln_modulate's shift); B ≤ 65535.
bool supports_gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);
// x + gate.unsqueeze(1)·y in x's dtype. ∂x is the incoming gradient itself.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// x [B, H, L, Dh] (unit stride on Dh; other strides free), Dh even ≤ 1024, B, H ≤ 65535;
// angles [B or 1, L, Dh/2, 2] (made contiguous fp32).
bool supports_rope(const at::Tensor& x, const at::Tensor& angles);
// models::apply_rope (models/flux/rope.h): interleaved pairs rotated in fp32, contiguous output in
// x's dtype. No gradient for the angles (an undefined one).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& angles);

// x [..., Dh] with Dh ≤ 256 (a 4-D x may have any strides but the last), weight [Dh] (made fp32).
bool supports_qk_rmsnorm(const at::Tensor& x, const at::Tensor& weight);
// Flux's RmsNorm (models/flux/flux.cpp): round(x·rsqrt(mean(x²) + eps)) · weight, fp32 math,
// the normalised value rounded to x's dtype before the weight as there; output contiguous in x's
// dtype and shape. Gradients for x and weight.
at::Tensor qk_rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps = 1e-6);

// ---- fp8 casts (not differentiable; fp8_cast_reference.h is the same math, bit for bit) -----
// fp8_dtype: at::kFloat8_e4m3fn (saturates at ±448) or at::kFloat8_e5m2 (±57344).
bool supports_fp8_cast(const at::Tensor& x);  // amax, cast_to_fp8: any shape
// max|x| as a 0-dim fp32 tensor on x's device (NaN propagates), no host sync.
at::Tensor amax(const at::Tensor& x);
// saturate(x·scale) → fp8, x's shape; scale 0-dim fp32 (on the device: no sync). When amax_out
// (a 0-dim fp32 CUDA tensor, e.g. a slot of an amax history) is given, it is overwritten with
// max|x| from the same pass.
at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8_dtype,
                       const at::Tensor& amax_out = {});
bool supports_rowwise_cast_to_fp8(const at::Tensor& x);  // 2-D
// x [M, K] → (fp8 [M, K], inverse scales [M, 1] fp32), power-of-two scales
// 2^floor(log2(max_finite / max(amax_row, 1e-12))); all-zero rows scale 1. One block per row.
std::pair<at::Tensor, at::Tensor> rowwise_cast_to_fp8(const at::Tensor& x, at::ScalarType fp8_dtype);
bool supports_mx_block_cast_to_fp8(const at::Tensor& x);  // 2-D, K % 32 == 0
// OCP MX: x [M, K] → (e4m3 [M, K], e8m0 exponents [M, K/32] uint8, biased by 127: the block's
// scale is 2^(e − 127); fp8_reference::e8m0_to_float gives them as fp32, `.view(at::kFloat8_e8m0fnu)`
// as torch's e8m0 dtype). shared_exp by `rule` (fp8_reference::MxExponent), zero blocks stay zero.
std::pair<at::Tensor, at::Tensor> mx_block_cast_to_fp8(const at::Tensor& x, fp8_reference::MxExponent rule);

#else  // built without FLOWTRAIN_CUDA: nothing is supported

[[noreturn]] inline void no_cuda_kernels() {
  throw std::logic_error("flowtrain was built without FLOWTRAIN_CUDA: no fused CUDA kernels (check supports_*)");
}
inline bool supports_adaln_modulate(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }
inline at::Tensor adaln_modulate(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) { no_cuda_kernels(); }
inline bool supports_gated_residual(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }
inline at::Tensor gated_residual(const at::Tensor&, const at::Tensor&, const at::Tensor&) { no_cuda_kernels(); }
inline bool supports_rope(const at::Tensor&, const at::Tensor&) { return false; }
inline at::Tensor apply_rope(const at::Tensor&, const at::Tensor&) { no_cuda_kernels(); }
inline bool supports_qk_rmsnorm(const at::Tensor&, const at::Tensor&) { return false; }
inline at::Tensor qk_rmsnorm(const at::Tensor&, const at::Tensor&, double = 1e-6) { no_cuda_kernels(); }
inline bool supports_fp8_cast(const at::Tensor&) { return false; }
inline at::Tensor amax(const at::Tensor&) { no_cuda_kernels(); }
inline at::Tensor cast_to_fp8(const at::Tensor&, const at::Tensor&, at::ScalarType, const at::Tensor& = {}) {
  no_cuda_kernels();
}
inline bool supports_rowwise_cast_to_fp8(const at::Tensor&) { return false; }
inline std::pair<at::Tensor, at::Tensor> rowwise_cast_to_fp8(const at::Tensor&, at::ScalarType) { no_cuda_kernels(); }
inline bool supports_mx_block_cast_to_fp8(const at::Tensor&) { return false; }
inline std::pair<at::Tensor, at::Tensor> mx_block_cast_to_fp8(const at::Tensor&, fp8_reference::MxExponent) {
  no_cuda_kernels();
}

#endif

}  // namespace flowtrain::models::cuda_fused
