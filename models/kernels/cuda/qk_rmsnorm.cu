// Flux's QK-RMSNorm (models/flux/flux.cpp RmsNorm) on each head's query or key vector:
//   n = round_T(x · rsqrt(mean(x²) + eps)),   y = round_T(n · w)
// in fp32 with x's dtype T for n and y, as the reference rounds `(xf·rrms).to(x dtype)` before
// multiplying by the scale. x (B, H, L, Dh) with unit stride on Dh and any other strides (q/k
// straight out of the qkv split); w (Dh) fp32; y (B, H, L, Dh) contiguous; rrms (B·H·L) fp32.
// Backward, gw = g·w:  ∂x = rrms·gw − x·rrms³·(Σ gw·x)/Dh,   ∂w = Σ_rows g·n.
// Rows are short (Dh = 128 in Flux), so `tpr` lanes of a warp (a power of two ≤ 32) share a row:
// its packs stay in registers between the reduction and the write, the reduction is a few
// shuffles. One wave of blocks walks the rows grid-stride; in the backward each lane owns the same
// columns of every row it visits and sums g·n for them in shared memory, and each block writes
// one partial ∂w row (blocks, Dh), summed at the end: the split depends on the shape and the
// device, not on timing, so results are the same on every run.
#include "models/kernels/cuda/device_utils.cuh"
#include "models/kernels/cuda/launch.h"

#include <ATen/ops/zeros.h>

namespace flowtrain::models::cuda_fused {
namespace {
using namespace device;

constexpr int kThreads = 256;

// The start of row r = (b·H + h)·L + l of x.
template <typename T>
__device__ __forceinline__ const T* row_ptr(const T* x, int64_t r, int64_t sb, int64_t sh, int64_t sl, int H, int L) {
  const int64_t l = r % L, bh = r / L;
  return x + (bh / H) * sb + (bh % H) * sh + l * sl;
}

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(
    const T* __restrict__ x, int64_t sb, int64_t sh, int64_t sl, int H, int L, const float* __restrict__ w,
    T* __restrict__ y, float* __restrict__ rrms, int64_t rows, int Dh, float eps, int tpr) {
  const int lane = threadIdx.x % tpr, group = threadIdx.x / tpr, groups = blockDim.x / tpr;
  const int packs = Dh / VEC;
  // `base` is the same for the whole block, so every lane reaches the shuffles of every pass.
  for (int64_t base = int64_t(blockIdx.x) * groups; base < rows; base += int64_t(gridDim.x) * groups) {
    const int64_t r = base + group;
    const bool valid = r < rows;
    const T* xr = valid ? row_ptr(x, r, sb, sh, sl, H, L) : x;
    Pack<T, VEC> cache[ITEMS];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = lane + k * tpr;
      if (valid && j < packs) {
        cache[k] = load<T, VEC>(xr + j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float v = static_cast<float>(cache[k].v[e]);
          ss += v * v;
        }
      }
    }
    const float rr = rsqrtf(warp_sum(ss, tpr) / Dh + eps);
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = lane + k * tpr;
      if (j < packs) {
        const Pack<float, VEC> wp = load<float, VEC>(w + j * VEC);
        Pack<T, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const T n = static_cast<T>(static_cast<float>(cache[k].v[e]) * rr);
          out.v[e] = static_cast<T>(static_cast<float>(n) * wp.v[e]);
        }
        store<T, VEC>(y + r * Dh + j * VEC, out);
      }
    }
    if (lane == 0) rrms[r] = rr;
  }
}

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(
    const T* __restrict__ g, const T* __restrict__ x, int64_t sb, int64_t sh, int64_t sl, int H, int L,
    const float* __restrict__ w, const float* __restrict__ rrms, T* __restrict__ dx, float* __restrict__ dw_part,
    int64_t rows, int Dh, int tpr) {
  // (groups, VEC, packs): each row group's ∂w sums, element e of pack j at [e][j].
  extern __shared__ float acc[];
  const int lane = threadIdx.x % tpr, group = threadIdx.x / tpr, groups = blockDim.x / tpr;
  const int packs = Dh / VEC;
  float* my_acc = acc + group * Dh;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = lane + k * tpr;
    if (j < packs) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) my_acc[e * packs + j] = 0.f;
    }
  }
  for (int64_t base = int64_t(blockIdx.x) * groups; base < rows; base += int64_t(gridDim.x) * groups) {
    const int64_t r = base + group;
    const bool valid = r < rows;
    const T* xr = valid ? row_ptr(x, r, sb, sh, sl, H, L) : x;
    const float rr = valid ? rrms[r] : 0.f;
    Pack<T, VEC> xc[ITEMS], gc[ITEMS];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = lane + k * tpr;
      if (valid && j < packs) {
        xc[k] = load<T, VEC>(xr + j * VEC);
        gc[k] = load<T, VEC>(g + r * Dh + j * VEC);
        const Pack<float, VEC> wp = load<float, VEC>(w + j * VEC);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float xv = static_cast<float>(xc[k].v[e]), gv = static_cast<float>(gc[k].v[e]);
          dot += gv * wp.v[e] * xv;
          my_acc[e * packs + j] += gv * static_cast<float>(static_cast<T>(xv * rr));
        }
      }
    }
    const float c = rr * rr * rr * warp_sum(dot, tpr) / Dh;
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int j = lane + k * tpr;
      if (j < packs) {
        const Pack<float, VEC> wp = load<float, VEC>(w + j * VEC);
        Pack<T, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float gw = static_cast<float>(gc[k].v[e]) * wp.v[e];
          out.v[e] = static_cast<T>(rr * gw - static_cast<float>(xc[k].v[e]) * c);
        }
        store<T, VEC>(dx + r * Dh + j * VEC, out);
      }
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < Dh; d += blockDim.x) {
    const int j = d / VEC, e = d % VEC;
    float s = 0.f;
    for (int q = 0; q < groups; ++q) s += acc[q * Dh + e * packs + j];
    dw_part[int64_t(blockIdx.x) * Dh + d] = s;
  }
}

struct RowSplit {
  int tpr, items;
};
// Lanes per row: the packs of a row rounded up to a power of two, at most a warp.
RowSplit row_split(int64_t packs) {
  int tpr = 1;
  while (tpr < 32 && tpr < packs) tpr *= 2;
  const int64_t items = (packs + tpr - 1) / tpr;
  TORCH_CHECK(items <= kMaxItems, "qk_rmsnorm: a row of ", packs, " packs exceeds the register cache");
  return {tpr, static_cast<int>(items)};
}

}  // namespace

namespace launch {

void rmsnorm_forward(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& y,
                     const at::Tensor& rrms) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(3) <= 256, "rmsnorm_forward: x [B, H, L, Dh ≤ 256] expected");
  const int64_t H = x.size(1), L = x.size(2), Dh = x.size(3), rows = x.numel() / Dh;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FT_DISPATCH_FLOATING(x.scalar_type(), "rmsnorm_forward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = Dh % wide == 0 && x.stride(0) % wide == 0 && x.stride(1) % wide == 0 &&
                           x.stride(2) % wide == 0 && aligned(x.data_ptr(), 16) && aligned(y.data_ptr(), 16) &&
                           aligned(weight.data_ptr(), 4 * wide);
    FT_DISPATCH_VEC(vectorize, [&] {
      const RowSplit split = row_split(Dh / kVec);
      const int64_t groups = kThreads / split.tpr;
      FT_DISPATCH_ITEMS(split.items, [&] {
        auto* kernel = &rmsnorm_forward_kernel<scalar_t, kVec, kItems>;
        const int64_t blocks = std::min((rows + groups - 1) / groups, resident_blocks(kernel, kThreads));
        kernel<<<blocks, kThreads, 0, stream>>>(
            x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.stride(2), static_cast<int>(H),
            static_cast<int>(L), weight.const_data_ptr<float>(), y.mutable_data_ptr<scalar_t>(),
            rrms.mutable_data_ptr<float>(), rows, static_cast<int>(Dh), static_cast<float>(eps), split.tpr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

at::Tensor rmsnorm_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rrms,
                            const at::Tensor& dx) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1 && x.size(3) <= 256, "rmsnorm_backward: x [B, H, L, Dh ≤ 256] expected");
  const int64_t H = x.size(1), L = x.size(2), Dh = x.size(3);
  if (x.numel() == 0) return at::zeros({Dh}, x.options().dtype(at::kFloat));
  const int64_t rows = x.numel() / Dh;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor dweight;
  FT_DISPATCH_FLOATING(x.scalar_type(), "rmsnorm_backward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = Dh % wide == 0 && x.stride(0) % wide == 0 && x.stride(1) % wide == 0 &&
                           x.stride(2) % wide == 0 && aligned(x.data_ptr(), 16) && aligned(g.data_ptr(), 16) &&
                           aligned(dx.data_ptr(), 16) && aligned(weight.data_ptr(), 4 * wide);
    FT_DISPATCH_VEC(vectorize, [&] {
      const RowSplit split = row_split(Dh / kVec);
      const int64_t groups = kThreads / split.tpr;
      const size_t smem = groups * Dh * sizeof(float);  // ≤ 8 KiB for Dh ≤ 256
      FT_DISPATCH_ITEMS(split.items, [&] {
        auto* kernel = &rmsnorm_backward_kernel<scalar_t, kVec, kItems>;
        // one wave: each block adds one (Dh) row of partial sums
        const int64_t blocks = std::min((rows + groups - 1) / groups, resident_blocks(kernel, kThreads, smem));
        dweight = at::empty({blocks, Dh}, x.options().dtype(at::kFloat));
        kernel<<<blocks, kThreads, smem, stream>>>(
            g.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), x.stride(2),
            static_cast<int>(H), static_cast<int>(L), weight.const_data_ptr<float>(), rrms.const_data_ptr<float>(),
            dx.mutable_data_ptr<scalar_t>(), dweight.mutable_data_ptr<float>(), rows, static_cast<int>(Dh),
            split.tpr);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
  return dweight.sum(0);
}

}  // namespace launch
}  // namespace flowtrain::models::cuda_fused
