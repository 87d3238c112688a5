#pragma once
// Helpers shared by the fused kernels: packed loads/stores (one 16-byte access per thread where
// the data is aligned), warp and block reductions in fp32, the launch shape of a row-per-block
// kernel and the dtype/vector-width dispatch.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace flowtrain::models::cuda_fused::device {

// N consecutive elements moved as one access: 16 bytes when N = 16 / sizeof(T).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// Sum over `width` consecutive lanes (a power of two ≤ 32); every lane of the warp must call it.
__device__ __forceinline__ float warp_sum(float v, int width = 32) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, width);
  return v;
}

// max that propagates NaN (fmaxf drops it): a NaN input must show in an amax.
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || a > b) ? a : b; }

__device__ __forceinline__ float warp_max(float v, int width = 32) {
  for (int o = width / 2; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o, width));
  return v;
}

// The sums of a and b over the block (blockDim.x a multiple of 32, ≤ 1024), returned to every
// thread. `scratch` holds 64 floats; the trailing barrier lets the caller reuse it at once. The
// order of additions is fixed, so results do not vary from run to run.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = warp_sum(lane < warps ? scratch[lane] : 0.f);
  b = warp_sum(lane < warps ? scratch[32 + lane] : 0.f);
  __syncthreads();
  return make_float2(a, b);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_max(lane < warps ? scratch[lane] : 0.f);
  __syncthreads();
  return v;
}

// Row-per-block kernels cache their row in registers, `items` packs per thread (≤ kMaxItems), and
// are compiled for at most kMaxRowThreads threads (__launch_bounds__: ≤ 128 registers a thread).
// So a row holds at most kMaxItems · kMaxRowThreads packs (4096 elements unvectorised). The cache
// size is a template parameter (FT_DISPATCH_ITEMS): the register count of the kernel follows it,
// and rows of DiT/Flux widths need ≤ 2 packs a thread, at twice the occupancy of 8.
constexpr int kMaxItems = 8;
constexpr int kMaxRowThreads = 512;
struct RowShape {
  int threads, items;
};
// One pack a thread up to 256 packs, two up to 2·kMaxRowThreads, then kMaxRowThreads threads with
// as many as it takes; threads a multiple of 32. items > kMaxItems: the row does not fit the cache
// (only fp8_cast.cu's row kernel takes such rows, re-reading the rest).
inline RowShape row_shape(int64_t packs) {
  const int64_t items = packs <= 256 ? 1 : packs <= 2 * kMaxRowThreads ? 2 : (packs + kMaxRowThreads - 1) / kMaxRowThreads;
  const int64_t threads = std::max<int64_t>(32, ((packs + items - 1) / items + 31) / 32 * 32);
  return {static_cast<int>(std::min<int64_t>(threads, kMaxRowThreads)), static_cast<int>(items)};
}

inline bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// How many blocks of `kernel` (threads each, smem bytes of dynamic shared memory) the current
// device holds at once. Grid-stride kernels and the chunked token reductions launch exactly this
// many: one full wave, no half-empty tail, and the fewest partial sums.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t smem = 0) {
  int device = 0, sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return std::max<int64_t>(1, int64_t(sms) * per_sm);
}

// Threads for `packs` packs in as few passes of ≤ max_threads as possible, evenly shared
// (384 packs: 192 threads × 2), a multiple of 32.
inline int even_threads(int64_t packs, int64_t max_threads) {
  const int64_t passes = std::max<int64_t>(1, (packs + max_threads - 1) / max_threads);
  return static_cast<int>(std::max<int64_t>(32, ((packs + passes - 1) / passes + 31) / 32 * 32));
}

}  // namespace flowtrain::models::cuda_fused::device

// AT_DISPATCH_FLOATING_TYPES_AND2(kBFloat16, kHalf, …) less double: the kernels are for training
// activations, supports_* turns double away, and each instantiation costs nvcc time per arch.
#define FT_DISPATCH_FLOATING(type, name, ...)                   \
  AT_DISPATCH_SWITCH(type, name,                                \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)  \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

// Runs the statement with `kItems` bound to 2 when items ≤ 2, else to kMaxItems.
#define FT_DISPATCH_ITEMS(items, ...)                                 \
  do {                                                                \
    if ((items) <= 2) {                                               \
      constexpr int kItems = 2;                                       \
      __VA_ARGS__();                                                  \
    } else {                                                          \
      constexpr int kItems = ::flowtrain::models::cuda_fused::device::kMaxItems; \
      __VA_ARGS__();                                                  \
    }                                                                 \
  } while (0)

// Runs the statement with `kVec` bound to 16 / sizeof(scalar_t) when `vectorize`, else 1.
#define FT_DISPATCH_VEC(vectorize, ...)                  \
  do {                                                   \
    if (vectorize) {                                     \
      constexpr int kVec = 16 / int(sizeof(scalar_t));   \
      __VA_ARGS__();                                     \
    } else {                                             \
      constexpr int kVec = 1;                            \
      __VA_ARGS__();                                     \
    }                                                    \
  } while (0)
