#pragma once
// The host launchers of the fused CUDA kernels (one .cu per concept beside this header), called by
// cuda_fused.cpp. Plain C++ so the autograd wrappers compile with the C++ compiler and the .cu
// files need no autograd headers. Callers allocate the outputs, except the backward passes'
// reductions over tokens/rows, which the launchers size from the device's occupancy and return.
// The launchers check shapes only as far as the kernels need (cuda_fused.cpp's supports_* are the
// contract), run on the current stream of the tensors' device and check each launch.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace flowtrain::models::cuda_fused::launch {

// ---- adaln_modulate.cu -------------------------------------------------------------------------
// The row-per-block kernels hold a row in registers: D ≤ kMaxRowElements (device_utils.cuh).
constexpr int64_t kMaxRowElements = 4096;
// x, y [B, N, D] contiguous; shift, scale [B, D] of x's dtype with unit inner stride; mean, rstd
// [B·N] fp32.
void adaln_forward(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps,
                   const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd);
// g, x, dx [B, N, D] contiguous. Returns (∂shift, ∂scale) [B, D] fp32: per-chunk partial sums
// over tokens (one wave of blocks), summed in a fixed order.
std::pair<at::Tensor, at::Tensor> adaln_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                                                 const at::Tensor& rstd, const at::Tensor& scale, const at::Tensor& dx);

// ---- gated_residual.cu -------------------------------------------------------------------------
// out = x + gate·y: x, y, out [B, N, D] contiguous, gate [B, D] of x's dtype, unit inner stride.
void gated_forward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& out);
// dy = g·gate; returns ∂gate [B, D] fp32 (partial sums over chunks of tokens, then their sum).
at::Tensor gated_backward(const at::Tensor& g, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& dy);

// ---- rope.cu -------------------------------------------------------------------------------------
// out [B, H, L, Dh] contiguous = x [B, H, L, Dh] (unit stride on Dh, any other strides) rotated by
// angles [1 or B, L, Dh/2, 2] fp32 contiguous; inverse = true rotates by −angle (the backward).
void rope(const at::Tensor& x, const at::Tensor& angles, bool inverse, const at::Tensor& out);

// ---- qk_rmsnorm.cu -------------------------------------------------------------------------------
// x [B, H, L, Dh] (unit stride on Dh, any other strides), weight [Dh] fp32 contiguous; y [B, H, L, Dh]
// contiguous of x's dtype, rrms [B·H·L] fp32.
void rmsnorm_forward(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& y,
                     const at::Tensor& rrms);
// g [B, H, L, Dh] contiguous, dx like y; returns ∂weight [Dh] fp32 (per-block partials, summed).
at::Tensor rmsnorm_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rrms,
                            const at::Tensor& dx);

// ---- fp8_cast.cu ---------------------------------------------------------------------------------
// Every x contiguous, fp32/bf16/fp16; `e4m3` picks e4m3fn (±448) over e5m2 (±57344).
// amax_out: 0-dim fp32, overwritten with max|x| (NaN propagates).
void amax(const at::Tensor& x, const at::Tensor& amax_out);
// out (fp8, x's shape) = saturate(x·scale); scale 0-dim fp32 on the device. amax_out, when
// defined, is overwritten with max|x| in the same pass.
void cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, bool e4m3, const at::Tensor& out,
                 const at::Tensor& amax_out);
// x [M, K]: out fp8 [M, K], inv_scale [M, 1] fp32 (see cuda_fused.h for the scale rule).
void rowwise_cast_to_fp8(const at::Tensor& x, bool e4m3, const at::Tensor& out, const at::Tensor& inv_scale);
// x [M, K], K % 32 == 0: out e4m3 [M, K], exponents uint8 [M, K/32] (biased e8m0); rceil picks
// fp8_reference::MxExponent::rceil over the OCP floor rule.
void mx_block_cast_to_fp8(const at::Tensor& x, bool rceil, const at::Tensor& out, const at::Tensor& exponents);

}  // namespace flowtrain::models::cuda_fused::launch
