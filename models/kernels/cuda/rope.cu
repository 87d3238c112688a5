// Rotary position embedding on interleaved pairs, as models/flux/rope.h (FLUX.1's apply_rope):
//   (x₂ᵢ, x₂ᵢ₊₁) → (cos·x₂ᵢ − sin·x₂ᵢ₊₁, sin·x₂ᵢ + cos·x₂ᵢ₊₁), in fp32, out in x's dtype.
//   x (B, H, L, Dh), unit stride on Dh and any strides on B, H, L (q/k straight out of the qkv
//   split); angles (1 or B, L, Dh/2, 2) fp32 contiguous, (cos, sin) per pair, shared by the heads;
//   out (B, H, L, Dh) contiguous.
// The backward is the same kernel rotating by −angle (the rotation's transpose).
// Grid (L tiles, H, B), so no index division; each thread rotates P pairs: 16 bytes of x and
// 8·P bytes of angles in packed loads when aligned, one pair otherwise. The angles are read once
// per head, from L2 after the first.
#include "models/kernels/cuda/device_utils.cuh"
#include "models/kernels/cuda/launch.h"

namespace flowtrain::models::cuda_fused {
namespace {
using namespace device;

template <typename T, int P>
__global__ void rope_kernel(const T* __restrict__ x, int64_t sb, int64_t sh, int64_t sl,
                            const float* __restrict__ angles, int64_t angles_sb, T* __restrict__ out, int H, int L,
                            int Dh, float sin_sign) {
  const int l = blockIdx.x * blockDim.y + threadIdx.y;
  if (l >= L) return;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int i0 = threadIdx.x * P;  // first pair of this thread; blockDim.x · P = Dh / 2
  const T* xr = x + b * sb + h * sh + l * sl + 2 * i0;
  const float* ar = angles + b * angles_sb + int64_t(l) * Dh + 2 * i0;
  T* orow = out + ((b * H + h) * L + l) * Dh + 2 * i0;
  if constexpr (P == 1) {
    const float x0 = static_cast<float>(xr[0]), x1 = static_cast<float>(xr[1]);
    const float c = ar[0], s = sin_sign * ar[1];
    orow[0] = static_cast<T>(c * x0 - s * x1);
    orow[1] = static_cast<T>(s * x0 + c * x1);
  } else {
    const Pack<T, 2 * P> xp = load<T, 2 * P>(xr);
    const Pack<float, 2 * P> ap = load<float, 2 * P>(ar);
    Pack<T, 2 * P> r;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float x0 = static_cast<float>(xp.v[2 * p]), x1 = static_cast<float>(xp.v[2 * p + 1]);
      const float c = ap.v[2 * p], s = sin_sign * ap.v[2 * p + 1];
      r.v[2 * p] = static_cast<T>(c * x0 - s * x1);
      r.v[2 * p + 1] = static_cast<T>(s * x0 + c * x1);
    }
    store<T, 2 * P>(orow, r);
  }
}

}  // namespace

namespace launch {

void rope(const at::Tensor& x, const at::Tensor& angles, bool inverse, const at::Tensor& out) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0), H = x.size(1), L = x.size(2), Dh = x.size(3);
  TORCH_CHECK(x.stride(3) == 1 && Dh % 2 == 0 && Dh <= 1024 && B <= 65535 && H <= 65535,
              "rope: x [B ≤ 65535, H ≤ 65535, L, Dh ≤ 1024 even] with unit stride on Dh, got ", x.sizes());
  const int64_t angles_sb = angles.size(0) == 1 ? 0 : angles.stride(0);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FT_DISPATCH_FLOATING(x.scalar_type(), "rope", [&] {
    constexpr int kPairs = 8 / sizeof(scalar_t);  // 16 bytes of x
    const bool vectorize = Dh % (2 * kPairs) == 0 && x.stride(0) % (2 * kPairs) == 0 &&
                           x.stride(1) % (2 * kPairs) == 0 && x.stride(2) % (2 * kPairs) == 0 &&
                           aligned(x.data_ptr(), 16) && aligned(out.data_ptr(), 16) &&
                           aligned(angles.data_ptr(), 8 * kPairs);
    auto run = [&](auto pairs) {
      constexpr int P = decltype(pairs)::value;
      const int tx = static_cast<int>(Dh / (2 * P)), ty = std::max(1, 256 / tx);
      const dim3 grid(static_cast<unsigned>((L + ty - 1) / ty), H, B);
      rope_kernel<scalar_t, P><<<grid, dim3(tx, ty), 0, stream>>>(
          x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.stride(2), angles.const_data_ptr<float>(),
          angles_sb, out.mutable_data_ptr<scalar_t>(), static_cast<int>(H), static_cast<int>(L), static_cast<int>(Dh),
          inverse ? -1.f : 1.f);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vectorize) run(std::integral_constant<int, kPairs>{});
    else run(std::integral_constant<int, 1>{});
  });
}

}  // namespace launch
}  // namespace flowtrain::models::cuda_fused
