#pragma once
// Fused fp32 CPU kernels, with their own autograd, for the elementwise parts of a DiT block:
// adaLN modulation (LayerNorm + shift/scale) and the gated residual.
// These are memory-bound passes over [B, N, D] activations; ATen runs each as 2–4 separate
// kernels (each a full pass over memory, plus saved intermediates and broadcast-gradient
// reductions), these run one pass each way. layers.h picks them for fp32 CPU tensors and
// uses the ATen composition everywhere else (CUDA, bf16); tests/unit/test_dit.cpp checks both
// against the float64 composition.
#include <ATen/ATen.h>

#include <initializer_list>

namespace flowtrain::models::cpu_fused {

// True when the kernels below take these operands: fp32 CPU tokens [B, N, D], per-sample
// vectors [B, D] and optionally a second token tensor of the same shape.
bool supports(const at::Tensor& tokens, std::initializer_list<const at::Tensor*> per_sample,
              const at::Tensor* other_tokens = nullptr);

// LayerNorm(x) (no affine, eps) · (1 + scale) + shift; saves x and the per-token μ, σ⁻¹.
at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);

// x + gate·y with gate [B, D] broadcast over tokens.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

}  // namespace flowtrain::models::cpu_fused
