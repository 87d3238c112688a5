// FP8 casts in one pass over the source (models/kernels/fp8_cast_reference.h is the same math in
// ATen, and what the tests compare against bit for bit):
//   amax                 max|x| over the tensor: grid-stride, block max, one atomicMax per block on
//                        the float's bits (monotone for non-negative floats; NaN, whose |·| bits
//                        are the largest, wins as it should).
//   cast_to_fp8          saturate(x·scale) with a device-side scale (no host sync), optionally
//                        max|x| of the same pass into an amax slot (delayed scaling's history).
//   rowwise_cast_to_fp8  one block per row: the row into registers, block max, the power-of-two
//                        scale 2^floor(log2(max_finite / max(amax, 1e-12))) from the float's
//                        exponent bits (exact, unlike log2), cast. Rows with amax 0 (or NaN) keep
//                        scale 1, as models/fp8 quantize_rows.
//   mx_block_cast_to_fp8 OCP MX e4m3: per 32 elements (32 / VEC lanes of a warp, one pack each)
//                        shared_exp = floor(log2(amax)) − 8 (OCP) or ceil(log2(amax / 448))
//                        (rceil) clamped to [−127, 127], elements x·2^−shared_exp saturated to
//                        e4m3, the exponent stored biased (e8m0).
// Conversions are <cuda_fp8.h>'s round-to-nearest-even with __NV_SATFINITE: ±max_finite for
// anything beyond, NaN stays NaN.
#include "models/kernels/cuda/device_utils.cuh"
#include "models/kernels/cuda/launch.h"

#include <cuda_fp8.h>

namespace flowtrain::models::cuda_fused {
namespace {
using namespace device;

constexpr int kThreads = 256;
constexpr float kAmaxFloor = 1e-12f;
constexpr int kE4m3MaxExponent = 8;  // 448 = 1.75 · 2^8

template <bool E4M3>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, E4M3 ? __NV_E4M3 : __NV_E5M2));
}

__device__ __forceinline__ void atomic_max_nonnegative(float* address, float v) {
  // Non-negative floats order like their bits as ints. A NaN amax must win (the reference
  // propagates it): PTX leaves the sign of fabsf(NaN) unspecified, and a NaN with its sign bit
  // set is a negative int, below every finite value — so store the positive quiet NaN, whose
  // bits (0x7fffffff) are above +inf's.
  if (v != v) v = __int_as_float(0x7fffffff);
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(v));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) amax_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ amax) {
  __shared__ float scratch[64];
  const int64_t packs = n / VEC, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.f;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<T, VEC> xp = load<T, VEC>(x + p * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) m = nan_max(m, fabsf(static_cast<float>(xp.v[e])));
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) m = nan_max(m, fabsf(static_cast<float>(x[i])));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) atomic_max_nonnegative(amax, m);
}

template <typename T, int VEC, bool E4M3>
__global__ void __launch_bounds__(kThreads) cast_kernel(const T* __restrict__ x, int64_t n,
                                                        const float* __restrict__ scale, uint8_t* __restrict__ out,
                                                        float* __restrict__ amax) {
  __shared__ float scratch[64];
  const float s = *scale;
  const int64_t packs = n / VEC, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.f;
  for (int64_t p = tid; p < packs; p += stride) {
    const Pack<T, VEC> xp = load<T, VEC>(x + p * VEC);
    Pack<uint8_t, VEC> q;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float v = static_cast<float>(xp.v[e]);
      m = nan_max(m, fabsf(v));
      q.v[e] = to_fp8<E4M3>(v * s);
    }
    store<uint8_t, VEC>(out + p * VEC, q);
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) {
    const float v = static_cast<float>(x[i]);
    m = nan_max(m, fabsf(v));
    out[i] = to_fp8<E4M3>(v * s);
  }
  if (amax != nullptr) {  // the same for the whole block: block_max's barriers are safe
    m = block_max(m, scratch);
    if (threadIdx.x == 0) atomic_max_nonnegative(amax, m);
  }
}

// Packs j ≥ ITEMS·blockDim of a long row are read twice (amax, then cast) instead of cached.
template <typename T, int VEC, int ITEMS, bool E4M3>
__global__ void __launch_bounds__(kMaxRowThreads) rowwise_cast_kernel(const T* __restrict__ x, int64_t K,
                                                                      uint8_t* __restrict__ out,
                                                                      float* __restrict__ inv_scale) {
  __shared__ float scratch[64];
  const int64_t row = blockIdx.x;
  const int packs = static_cast<int>(K / VEC);
  const T* xr = x + row * K;
  uint8_t* orow = out + row * K;
  Pack<T, VEC> cache[ITEMS];
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < packs) {
      cache[k] = load<T, VEC>(xr + j * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = nan_max(m, fabsf(static_cast<float>(cache[k].v[e])));
    }
  }
  for (int j = threadIdx.x + ITEMS * blockDim.x; j < packs; j += blockDim.x) {
    const Pack<T, VEC> xp = load<T, VEC>(xr + j * VEC);
#pragma unroll
    for (int e = 0; e < VEC; ++e) m = nan_max(m, fabsf(static_cast<float>(xp.v[e])));
  }
  const float amax = block_max(m, scratch);
  float scale = 1.f, inv = 1.f;
  if (amax > 0.f) {
    const float q = (E4M3 ? 448.f : 57344.f) / (amax > kAmaxFloor ? amax : kAmaxFloor);
    // floor(log2(q)) from the exponent bits; q is normal or 0 (amax = inf), kept to [−126, 126]
    // so that both the scale and its inverse are normal floats.
    const int e = min(max(((__float_as_int(q) >> 23) & 0xff) - 127, -126), 126);
    scale = __int_as_float((e + 127) << 23);
    inv = __int_as_float((127 - e) << 23);
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < packs) {
      Pack<uint8_t, VEC> q;
#pragma unroll
      for (int e = 0; e < VEC; ++e) q.v[e] = to_fp8<E4M3>(static_cast<float>(cache[k].v[e]) * scale);
      store<uint8_t, VEC>(orow + j * VEC, q);
    }
  }
  for (int j = threadIdx.x + ITEMS * blockDim.x; j < packs; j += blockDim.x) {
    const Pack<T, VEC> xp = load<T, VEC>(xr + j * VEC);
    Pack<uint8_t, VEC> q;
#pragma unroll
    for (int e = 0; e < VEC; ++e) q.v[e] = to_fp8<E4M3>(static_cast<float>(xp.v[e]) * scale);
    store<uint8_t, VEC>(orow + j * VEC, q);
  }
  if (threadIdx.x == 0) inv_scale[row] = inv;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) mx_cast_kernel(const T* __restrict__ x, int64_t n,
                                                           uint8_t* __restrict__ out, uint8_t* __restrict__ exponents,
                                                           bool rceil) {
  constexpr int kLanes = 32 / VEC;  // lanes sharing one 32-element block
  const int64_t packs = n / VEC;
  // `base` is the same for the whole block (a multiple of kLanes), so each 32-element block
  // lies within one group of lanes and every lane reaches the shuffles.
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < packs; base += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = base + threadIdx.x;
    const bool valid = p < packs;
    Pack<T, VEC> xp;
    float m = 0.f;
    if (valid) {
      xp = load<T, VEC>(x + p * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = nan_max(m, fabsf(static_cast<float>(xp.v[e])));
    }
    m = warp_max(m, kLanes);
    // floor: floor(log2(amax)) = biased exponent − 127 for a normal amax; a subnormal or zero
    // amax (biased 0) lands below −127 and is clamped there, so zeros stay zeros.
    // rceil: ceil(log2(q)) of the correctly rounded fp32 q = amax / 448 from its bits, as
    // fp8_reference's ceil_log2 (a subnormal q is above 2^−127 exactly when its mantissa is).
    int unclamped;
    if (!rceil) {
      unclamped = ((__float_as_int(m) >> 23) & 0xff) - 127 - kE4m3MaxExponent;
    } else {
      const int q = __float_as_int(__fdiv_rn(m, 448.f));
      const int biased = (q >> 23) & 0xff, mantissa = q & 0x7fffff;
      unclamped = biased != 0 ? biased - 127 + (mantissa != 0) : (mantissa > (1 << 22) ? -126 : -127);
    }
    const int shared_exp = min(max(unclamped, -127), 127);
    // 2^−shared_exp, a normal float for every finite amax (shared_exp ≤ 120); a NaN or inf amax
    // under rceil clamps to 127 and gives 0 here: the non-finite elements come out NaN (inf·0)
    // and the rest of the block 0, as in the reference, for the non-finite checks to name.
    const float mult = __int_as_float((127 - shared_exp) << 23);
    if (valid) {
      Pack<uint8_t, VEC> q;
#pragma unroll
      for (int e = 0; e < VEC; ++e) q.v[e] = to_fp8<true>(static_cast<float>(xp.v[e]) * mult);
      store<uint8_t, VEC>(out + p * VEC, q);
      if (threadIdx.x % kLanes == 0) exponents[p / kLanes] = static_cast<uint8_t>(shared_exp + 127);
    }
  }
}

// Grid-stride kernels: one wave of blocks (one atomic each in the reductions), fewer when small.
template <typename Kernel>
int64_t stride_blocks(Kernel kernel, int64_t n, int vec) {
  return std::max<int64_t>(1, std::min<int64_t>(resident_blocks(kernel, kThreads), (n / vec + kThreads - 1) / kThreads));
}

}  // namespace

namespace launch {

void amax(const at::Tensor& x, const at::Tensor& amax_out) {
  const c10::cuda::CUDAGuard guard(x.device());
  amax_out.zero_();
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FT_DISPATCH_FLOATING(x.scalar_type(), "fp8_amax", [&] {
    FT_DISPATCH_VEC(aligned(x.data_ptr(), 16), [&] {
      auto* kernel = &amax_kernel<scalar_t, kVec>;
      kernel<<<stride_blocks(kernel, n, kVec), kThreads, 0, stream>>>(x.const_data_ptr<scalar_t>(), n,
                                                                       amax_out.mutable_data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, bool e4m3, const at::Tensor& out,
                 const at::Tensor& amax_out) {
  const c10::cuda::CUDAGuard guard(x.device());
  if (amax_out.defined()) amax_out.zero_();
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  float* amax_ptr = amax_out.defined() ? amax_out.mutable_data_ptr<float>() : nullptr;
  auto* out_ptr = static_cast<uint8_t*>(out.data_ptr());
  FT_DISPATCH_FLOATING(x.scalar_type(), "fp8_cast", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    FT_DISPATCH_VEC(aligned(x.data_ptr(), 16) && aligned(out_ptr, wide), [&] {
      auto* kernel = e4m3 ? &cast_kernel<scalar_t, kVec, true> : &cast_kernel<scalar_t, kVec, false>;
      kernel<<<stride_blocks(kernel, n, kVec), kThreads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), n, scale.const_data_ptr<float>(), out_ptr, amax_ptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void rowwise_cast_to_fp8(const at::Tensor& x, bool e4m3, const at::Tensor& out, const at::Tensor& inv_scale) {
  const c10::cuda::CUDAGuard guard(x.device());
  if (x.numel() == 0) {  // K = 0: M empty rows, scale 1 (not the allocator's leftovers)
    inv_scale.fill_(1);
    return;
  }
  const int64_t M = x.size(0), K = x.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto* out_ptr = static_cast<uint8_t*>(out.data_ptr());
  FT_DISPATCH_FLOATING(x.scalar_type(), "fp8_rowwise_cast", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    FT_DISPATCH_VEC(K % wide == 0 && aligned(x.data_ptr(), 16) && aligned(out_ptr, wide), [&] {
      const RowShape rs = row_shape(K / kVec);
      FT_DISPATCH_ITEMS(rs.items, [&] {
        if (e4m3) {
          rowwise_cast_kernel<scalar_t, kVec, kItems, true><<<M, rs.threads, 0, stream>>>(
              x.const_data_ptr<scalar_t>(), K, out_ptr, inv_scale.mutable_data_ptr<float>());
        } else {
          rowwise_cast_kernel<scalar_t, kVec, kItems, false><<<M, rs.threads, 0, stream>>>(
              x.const_data_ptr<scalar_t>(), K, out_ptr, inv_scale.mutable_data_ptr<float>());
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  });
}

void mx_block_cast_to_fp8(const at::Tensor& x, bool rceil, const at::Tensor& out, const at::Tensor& exponents) {
  const int64_t n = x.numel();
  if (n == 0) return;
  TORCH_CHECK(x.size(-1) % 32 == 0, "mx_block_cast_to_fp8: K = ", x.size(-1), " is not a multiple of 32");
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto* out_ptr = static_cast<uint8_t*>(out.data_ptr());
  auto* exp_ptr = static_cast<uint8_t*>(exponents.data_ptr());
  FT_DISPATCH_FLOATING(x.scalar_type(), "fp8_mx_cast", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    FT_DISPATCH_VEC(aligned(x.data_ptr(), 16) && aligned(out_ptr, wide), [&] {
      auto* kernel = &mx_cast_kernel<scalar_t, kVec>;
      kernel<<<stride_blocks(kernel, n, kVec), kThreads, 0, stream>>>(x.const_data_ptr<scalar_t>(), n, out_ptr,
                                                                       exp_ptr, rceil);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

}  // namespace launch
}  // namespace flowtrain::models::cuda_fused
