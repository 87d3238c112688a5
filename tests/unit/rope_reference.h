// RoPE on interleaved pairs by its formula, in float64, for the Flux tests: pair i of axis a
// (channels 2i, 2i+1 of that axis' slice of the head) rotates by id_a · θ^(−2i / axes[a]).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

namespace flowtrain::test {

// x [B, H, L, Dh] float64, ids [B, L, axes] float -> x rotated, float64.
inline at::Tensor rope_float64(const at::Tensor& x, const at::Tensor& ids, const std::vector<int64_t>& axes,
                               double theta) {
  at::Tensor want = x.clone();
  auto xa = x.accessor<double, 4>();
  auto wa = want.accessor<double, 4>();
  auto ia = ids.accessor<float, 3>();
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t l = 0; l < x.size(2); ++l) {
        int64_t base = 0;
        for (size_t a = 0; a < axes.size(); ++a) {
          for (int64_t i = 0; i < axes[a] / 2; ++i) {
            const double angle = ia[b][l][static_cast<int64_t>(a)] * std::pow(theta, -2.0 * i / double(axes[a]));
            const int64_t c = base + 2 * i;
            const double x0 = xa[b][h][l][c], x1 = xa[b][h][l][c + 1];
            wa[b][h][l][c] = std::cos(angle) * x0 - std::sin(angle) * x1;
            wa[b][h][l][c + 1] = std::sin(angle) * x0 + std::cos(angle) * x1;
          }
          base += axes[a];
        }
      }
  return want;
}

}  // namespace flowtrain::test
