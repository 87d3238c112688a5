// adaLN modulation of a DiT / Flux block: y = LayerNorm(x)·(1 + scale) + shift, the LayerNorm
// without affine over the last dim, shift and scale one row per sample broadcast over its tokens.
//   x, y, g, dx (B, N, D); shift, scale (B, D), rows of the adaLN linear's output (row stride ≥ D);
//   mean, rstd (B·N) fp32, saved by the forward for the backward.
// Forward: one block per token. The row is read once into registers, μ and σ² come from it in
// two block reductions (two-pass variance, as ATen's), y is written once: fp32 math, one rounding
// to x's dtype at the end.
// Backward, with x̂ = (x − μ)·σ⁻¹ and ĝ = g·(1 + scale):
//   ∂x = σ⁻¹·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)),   ∂shift = Σₙ g,   ∂scale = Σₙ g·x̂.
// One block per chunk of consecutive tokens of one sample. Per token: g and x into registers, one
// block reduction (Σĝ, Σĝx̂), ∂x written. The thread that owns a column owns it for every token of
// the chunk, so it accumulates ∂shift/∂scale for its columns in shared memory without atomics or
// barriers; the per-chunk partial sums (B, chunks, D) are then summed over chunks. The split
// depends on (B, N) and the device, not on timing: results are the same on every run.
#include "models/kernels/cuda/device_utils.cuh"
#include "models/kernels/cuda/launch.h"

#include <ATen/ops/zeros.h>

namespace flowtrain::models::cuda_fused {
namespace {
using namespace device;

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxRowThreads)
    adaln_forward_kernel(const T* __restrict__ x, const T* __restrict__ shift, int64_t shift_stride,
                         const T* __restrict__ scale, int64_t scale_stride, T* __restrict__ y,
                         float* __restrict__ mean, float* __restrict__ rstd, int64_t N, int D, float eps) {
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x, b = row / N;
  const int packs = D / VEC;
  const T* xr = x + row * D;
  Pack<T, VEC> cache[ITEMS];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < packs) {
      cache[k] = load<T, VEC>(xr + j * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += static_cast<float>(cache[k].v[e]);
    }
  }
  const float m = block_sum2(sum, 0.f, scratch).x / D;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < packs) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float c = static_cast<float>(cache[k].v[e]) - m;
        sq += c * c;
      }
    }
  }
  const float rs = rsqrtf(block_sum2(sq, 0.f, scratch).x / D + eps);
  const T* sh = shift + b * shift_stride;
  const T* sc = scale + b * scale_stride;
  T* yr = y + row * D;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < packs) {
      const Pack<T, VEC> s = load<T, VEC>(sh + j * VEC), c = load<T, VEC>(sc + j * VEC);
      Pack<T, VEC> out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xh = (static_cast<float>(cache[k].v[e]) - m) * rs;
        out.v[e] = static_cast<T>(xh * (1.f + static_cast<float>(c.v[e])) + static_cast<float>(s.v[e]));
      }
      store<T, VEC>(yr + j * VEC, out);
    }
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxRowThreads)
    adaln_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const float* __restrict__ mean,
                          const float* __restrict__ rstd, const T* __restrict__ scale, int64_t scale_stride,
                          T* __restrict__ dx, float* __restrict__ dshift_part, float* __restrict__ dscale_part,
                          int64_t N, int D, int64_t rows_per_chunk) {
  // (2, VEC, packs): ∂shift then ∂scale; element e of pack j at [e][j], so a warp's accesses to
  // one e are consecutive words (no bank conflicts).
  extern __shared__ float acc[];
  __shared__ float scratch[64];
  const int64_t b = blockIdx.y, chunk = blockIdx.x;
  const int64_t n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  const int packs = D / VEC;
  float* acc_shift = acc;
  float* acc_scale = acc + D;
  for (int j = threadIdx.x; j < packs; j += blockDim.x) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc_shift[e * packs + j] = acc_scale[e * packs + j] = 0.f;
  }
  const T* sc = scale + b * scale_stride;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t row = b * N + n;
    const float m = mean[row], rs = rstd[row];
    Pack<T, VEC> gc[ITEMS], xc[ITEMS];
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < packs) {
        gc[k] = load<T, VEC>(g + row * D + j * VEC);
        xc[k] = load<T, VEC>(x + row * D + j * VEC);
        const Pack<T, VEC> c = load<T, VEC>(sc + j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float gg = static_cast<float>(gc[k].v[e]);
          const float xh = (static_cast<float>(xc[k].v[e]) - m) * rs;
          const float gh = gg * (1.f + static_cast<float>(c.v[e]));
          s1 += gh;
          s2 += gh * xh;
          acc_shift[e * packs + j] += gg;
          acc_scale[e * packs + j] += gg * xh;
        }
      }
    }
    const float2 s = block_sum2(s1, s2, scratch);
    const float c1 = s.x / D, c2 = s.y / D;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < packs) {
        const Pack<T, VEC> c = load<T, VEC>(sc + j * VEC);  // (B, D): cached, not re-read from memory
        Pack<T, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float xh = (static_cast<float>(xc[k].v[e]) - m) * rs;
          const float gh = static_cast<float>(gc[k].v[e]) * (1.f + static_cast<float>(c.v[e]));
          out.v[e] = static_cast<T>(rs * ((gh - c1) - xh * c2));
        }
        store<T, VEC>(dx + row * D + j * VEC, out);
      }
    }
  }
  const int64_t out_row = (b * gridDim.x + chunk) * D;
  for (int j = threadIdx.x; j < packs; j += blockDim.x) {
    Pack<float, VEC> ps, pc;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      ps.v[e] = acc_shift[e * packs + j];
      pc.v[e] = acc_scale[e * packs + j];
    }
    store<float, VEC>(dshift_part + out_row + j * VEC, ps);
    store<float, VEC>(dscale_part + out_row + j * VEC, pc);
  }
}

}  // namespace

namespace launch {

void adaln_forward(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps,
                   const at::Tensor& y, const at::Tensor& mean, const at::Tensor& rstd) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  TORCH_CHECK(D <= kMaxRowElements, "adaln_forward: D = ", D, " > ", kMaxRowElements);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FT_DISPATCH_FLOATING(x.scalar_type(), "adaln_forward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = D % wide == 0 && shift.stride(0) % wide == 0 && scale.stride(0) % wide == 0 &&
                           aligned(x.data_ptr(), 16) && aligned(y.data_ptr(), 16) &&
                           aligned(shift.data_ptr(), 16) && aligned(scale.data_ptr(), 16);
    FT_DISPATCH_VEC(vectorize, [&] {
      const RowShape rs = row_shape(D / kVec);
      FT_DISPATCH_ITEMS(rs.items, [&] {
        adaln_forward_kernel<scalar_t, kVec, kItems><<<B * N, rs.threads, 0, stream>>>(
            x.const_data_ptr<scalar_t>(), shift.const_data_ptr<scalar_t>(), shift.stride(0),
            scale.const_data_ptr<scalar_t>(), scale.stride(0), y.mutable_data_ptr<scalar_t>(),
            mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), N, static_cast<int>(D),
            static_cast<float>(eps));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

std::pair<at::Tensor, at::Tensor> adaln_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                                                 const at::Tensor& rstd, const at::Tensor& scale, const at::Tensor& dx) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  if (x.numel() == 0) {
    const at::Tensor zeros = at::zeros({B, D}, x.options().dtype(at::kFloat));
    return {zeros, zeros.clone()};
  }
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(D <= kMaxRowElements, "adaln_backward: D = ", D, " > ", kMaxRowElements);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const size_t smem = 2 * D * sizeof(float);  // ≤ 32 KiB for D ≤ kMaxRowElements
  at::Tensor dshift, dscale;
  FT_DISPATCH_FLOATING(x.scalar_type(), "adaln_backward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = D % wide == 0 && scale.stride(0) % wide == 0 && aligned(g.data_ptr(), 16) &&
                           aligned(x.data_ptr(), 16) && aligned(dx.data_ptr(), 16) &&
                           aligned(scale.data_ptr(), 16);
    FT_DISPATCH_VEC(vectorize, [&] {
      const RowShape rs = row_shape(D / kVec);
      FT_DISPATCH_ITEMS(rs.items, [&] {
        auto* kernel = &adaln_backward_kernel<scalar_t, kVec, kItems>;
        // one wave of blocks, shared evenly between the samples; each sums a chunk of tokens
        const int64_t chunks = std::clamp<int64_t>(resident_blocks(kernel, rs.threads, smem) / B, 1, N);
        const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
        dshift = at::empty({B, chunks, D}, x.options().dtype(at::kFloat));
        dscale = at::empty({B, chunks, D}, x.options().dtype(at::kFloat));
        kernel<<<dim3(chunks, B), rs.threads, smem, stream>>>(
            g.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), mean.const_data_ptr<float>(),
            rstd.const_data_ptr<float>(), scale.const_data_ptr<scalar_t>(), scale.stride(0),
            dx.mutable_data_ptr<scalar_t>(), dshift.mutable_data_ptr<float>(), dscale.mutable_data_ptr<float>(), N,
            static_cast<int>(D), rows_per_chunk);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
  return {dshift.sum(1), dscale.sum(1)};
}

}  // namespace launch
}  // namespace flowtrain::models::cuda_fused
