// N-D rotary position embedding on interleaved pairs, as FLUX.1 (black-forest-labs/flux
// src/flux/math.py) and the video MMDiTs use it.
//
// Each token has an id per axis (Flux images: (0, row, col); text: (0, 0, 0); video: (t, row, col)).
// Axis a owns axes_dim[a] consecutive channels of every head (Σ axes_dim = head dim), i.e.
// axes_dim[a] / 2 pairs. Pair i of axis a rotates by the angle id_a · ω_i, ω_i = θ^(−2i / axes_dim[a]):
//   (x₂ᵢ, x₂ᵢ₊₁) → (cos·x₂ᵢ − sin·x₂ᵢ₊₁, sin·x₂ᵢ + cos·x₂ᵢ₊₁)      (GPT-J style, not rotate-half)
// computed in (at least) fp32 and returned in the input's dtype.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace flowtrain::models {

// ids [B, L, n_axes] (float) -> the rotation [B, L, head_dim / 2, 2] holding (cos, sin) per pair,
// fp32. Σ axes_dim must be the head dim; every entry even.
at::Tensor rope_angles(const at::Tensor& ids, const std::vector<int64_t>& axes_dim, double theta);

// x [B, H, L, head_dim] rotated pairwise by `angles` [B, L, head_dim / 2, 2] (from rope_angles).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& angles);

}  // namespace flowtrain::models
