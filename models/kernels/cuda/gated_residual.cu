// The gated residual of a DiT / Flux block: out = x + gate·y, gate one row per sample broadcast
// over its tokens.
//   x, y, out, g, dy (B, N, D); gate (B, D), a row of the adaLN linear's output (row stride ≥ D).
// Forward: one block per token, one pass, fp32 math and one rounding.
// Backward: ∂x = g (the caller passes g through, no kernel), ∂y = g·gate, ∂gate = Σₙ g·y. Each
// thread owns one pack of columns and walks a chunk of tokens of one sample down them (adjacent
// threads read adjacent packs of a token: coalesced), writing ∂y and summing g·y in registers; the
// per-chunk partial sums (B, chunks, D) fp32 are then summed over chunks. The split depends on
// (B, N, D) and the device, not on timing: results are the same on every run.
#include "models/kernels/cuda/device_utils.cuh"
#include "models/kernels/cuda/launch.h"

#include <ATen/ops/zeros.h>

namespace flowtrain::models::cuda_fused {
namespace {
using namespace device;

template <typename T, int VEC>
__global__ void gated_forward_kernel(const T* __restrict__ x, const T* __restrict__ gate, int64_t gate_stride,
                                     const T* __restrict__ y, T* __restrict__ out, int64_t N, int D) {
  const int64_t row = blockIdx.x, b = row / N;
  const int packs = D / VEC;
  const T* gt = gate + b * gate_stride;
  for (int j = threadIdx.x; j < packs; j += blockDim.x) {
    const int64_t o = row * D + int64_t(j) * VEC;
    const Pack<T, VEC> xp = load<T, VEC>(x + o), yp = load<T, VEC>(y + o), gp = load<T, VEC>(gt + j * VEC);
    Pack<T, VEC> r;
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      r.v[e] = static_cast<T>(static_cast<float>(xp.v[e]) +
                              static_cast<float>(gp.v[e]) * static_cast<float>(yp.v[e]));
    store<T, VEC>(out + o, r);
  }
}

template <typename T, int VEC>
__global__ void gated_backward_kernel(const T* __restrict__ g, const T* __restrict__ gate, int64_t gate_stride,
                                      const T* __restrict__ y, T* __restrict__ dy, float* __restrict__ dgate_part,
                                      int64_t N, int D, int64_t rows_per_chunk) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;  // the pack of columns this thread owns
  const int64_t chunk = blockIdx.y, b = blockIdx.z;
  if (j >= D / VEC) return;
  const Pack<T, VEC> gp = load<T, VEC>(gate + b * gate_stride + j * VEC);
  float gt[VEC], acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    gt[e] = static_cast<float>(gp.v[e]);
    acc[e] = 0.f;
  }
  const int64_t n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
#pragma unroll 4
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t o = (b * N + n) * D + int64_t(j) * VEC;
    const Pack<T, VEC> gg = load<T, VEC>(g + o), yp = load<T, VEC>(y + o);
    Pack<T, VEC> r;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float gv = static_cast<float>(gg.v[e]);
      r.v[e] = static_cast<T>(gv * gt[e]);
      acc[e] += gv * static_cast<float>(yp.v[e]);
    }
    store<T, VEC>(dy + o, r);
  }
  Pack<float, VEC> p;
#pragma unroll
  for (int e = 0; e < VEC; ++e) p.v[e] = acc[e];
  store<float, VEC>(dgate_part + (b * gridDim.y + chunk) * D + int64_t(j) * VEC, p);
}

}  // namespace

namespace launch {

void gated_forward(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& out) {
  if (x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FT_DISPATCH_FLOATING(x.scalar_type(), "gated_forward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = D % wide == 0 && gate.stride(0) % wide == 0 && aligned(x.data_ptr(), 16) &&
                           aligned(y.data_ptr(), 16) && aligned(out.data_ptr(), 16) && aligned(gate.data_ptr(), 16);
    FT_DISPATCH_VEC(vectorize, [&] {
      const int threads = even_threads(D / kVec, 256);
      gated_forward_kernel<scalar_t, kVec><<<B * N, threads, 0, stream>>>(
          x.const_data_ptr<scalar_t>(), gate.const_data_ptr<scalar_t>(), gate.stride(0), y.const_data_ptr<scalar_t>(),
          out.mutable_data_ptr<scalar_t>(), N, static_cast<int>(D));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

at::Tensor gated_backward(const at::Tensor& g, const at::Tensor& gate, const at::Tensor& y, const at::Tensor& dy) {
  const int64_t B = y.size(0), N = y.size(1), D = y.size(2);
  if (y.numel() == 0) return at::zeros({B, D}, y.options().dtype(at::kFloat));
  const c10::cuda::CUDAGuard guard(y.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor dgate;
  FT_DISPATCH_FLOATING(y.scalar_type(), "gated_backward", [&] {
    constexpr int wide = 16 / sizeof(scalar_t);
    const bool vectorize = D % wide == 0 && gate.stride(0) % wide == 0 && aligned(g.data_ptr(), 16) &&
                           aligned(y.data_ptr(), 16) && aligned(dy.data_ptr(), 16) && aligned(gate.data_ptr(), 16);
    FT_DISPATCH_VEC(vectorize, [&] {
      auto* kernel = &gated_backward_kernel<scalar_t, kVec>;
      const int64_t packs = D / kVec;
      const int threads = even_threads(packs, 256);
      const int64_t column_blocks = (packs + threads - 1) / threads;
      // one wave of blocks, shared evenly between samples and column blocks; each walks a chunk of tokens
      const int64_t chunks = std::clamp<int64_t>(resident_blocks(kernel, threads) / (B * column_blocks), 1,
                                                 std::min<int64_t>(N, 65535));
      const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
      dgate = at::empty({B, chunks, D}, y.options().dtype(at::kFloat));
      kernel<<<dim3(column_blocks, chunks, B), threads, 0, stream>>>(
          g.const_data_ptr<scalar_t>(), gate.const_data_ptr<scalar_t>(), gate.stride(0), y.const_data_ptr<scalar_t>(),
          dy.mutable_data_ptr<scalar_t>(), dgate.mutable_data_ptr<float>(), N, static_cast<int>(D), rows_per_chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return dgate.sum(1);
}

}  // namespace launch
}  // namespace flowtrain::models::cuda_fused
