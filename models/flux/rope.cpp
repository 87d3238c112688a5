#include "models/flux/rope.h"

#include "models/kernels/cuda/cuda_fused.h"

#include <c10/util/Exception.h>

namespace flowtrain::models {

at::Tensor rope_angles(const at::Tensor& ids, const std::vector<int64_t>& axes_dim, double theta) {
  TORCH_CHECK(ids.dim() == 3 && ids.size(2) == static_cast<int64_t>(axes_dim.size()), "rope_angles: ids [B, L, ",
              axes_dim.size(), "] expected, got ", ids.sizes());
  // In fp32 throughout, as the reference computes it (its ids are fp32), so both give the same
  // angles to the last bit where the ops agree.
  const auto f32 = ids.options().dtype(at::kFloat);
  std::vector<at::Tensor> per_axis;
  for (size_t a = 0; a < axes_dim.size(); ++a) {
    const int64_t dim = axes_dim[a];
    TORCH_CHECK(dim % 2 == 0, "rope_angles: axes_dim entries must be even, got ", dim);
    // ω_i = 1 / θ^(2i/dim), i = 0 … dim/2 − 1
    at::Tensor omega = 1.0 / at::pow(theta, at::arange(0, dim, 2, f32) / double(dim));
    per_axis.push_back(ids.select(2, a).to(at::kFloat).unsqueeze(-1) * omega);  // [B, L, dim/2]
  }
  at::Tensor angle = at::cat(per_axis, -1);  // [B, L, head_dim/2]
  return at::stack({at::cos(angle), at::sin(angle)}, -1).to(at::kFloat);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& angles) {
  if (cuda_fused::supports_rope(x, angles)) return cuda_fused::apply_rope(x, angles);  // one pass, fp32 math
  const int64_t D = x.size(-1);
  TORCH_CHECK(angles.size(-2) * 2 == D, "apply_rope: ", angles.size(-2), " pairs for head dim ", D);
  // At least fp32, as the reference (bf16 activations rotate in fp32); float64 stays float64.
  const at::ScalarType compute = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor pairs = x.to(compute).reshape({x.size(0), x.size(1), x.size(2), D / 2, 2});
  at::Tensor a = angles.unsqueeze(1).to(compute);  // [B, 1, L, D/2, 2]: the same rotation for every head
  at::Tensor cos = a.select(-1, 0), sin = a.select(-1, 1);
  at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  at::Tensor out = at::stack({cos * x0 - sin * x1, sin * x0 + cos * x1}, -1);
  return out.reshape(x.sizes()).to(x.scalar_type());
}

}  // namespace flowtrain::models
