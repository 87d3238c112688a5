#pragma once
// Fused fp32 CPU kernels, with their own autograd, for the parts of a DiT block where ATen's
// CPU path moves more memory than it computes: adaLN modulation (LayerNorm + shift/scale), the
// gated residual, attention over short sequences (cpu_attention.cpp) and the MLP's GELU
// (cpu_gelu.cpp).
// These are memory-bound passes over [B, N, D] activations; ATen runs each as 2–4 separate
// kernels (each a full pass over memory, plus saved intermediates and broadcast-gradient
// reductions), these run one pass each way. layers.h picks them for fp32 CPU tensors and
// uses the ATen composition everywhere else (CUDA, bf16); the fused-op table
// (tests/fused_op_table.h) checks them against that composition in float64.
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

// Self-attention of every head, softmax(q·kᵀ/√Dh)·v, read straight from the qkv projection's
// output [B, N, 3·D] (= [B, N, 3, H, Dh], timm's layout) and returned as [B, N, D] (heads
// concatenated: the proj layer's input); ∂qkv comes back in the same layout. Saves qkv and the
// [B, H, N, N] probabilities. For fp32 CPU with AVX2 + FMA, head dim % 8 == 0 and
// N ≤ kQkvAttentionMaxTokens, the range where it was measured to beat the explicit-GEMM
// composition (49 tokens, docs/perf.md); longer sequences take default_attention (layers.h).
constexpr int64_t kQkvAttentionMaxTokens = 64;
bool supports_qkv_attention(const at::Tensor& qkv, int64_t heads);
at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads);

// GELU, tanh approximation (at::gelu(x, "tanh")), written as x·σ(2u): one exponential per
// element forward and backward, saves x. fp32 CPU tensors on AVX2 + FMA CPUs; ~1 ulp from ATen's.
bool supports_gelu_tanh(const at::Tensor& x);
at::Tensor gelu_tanh(const at::Tensor& x);

}  // namespace flowtrain::models::cpu_fused
