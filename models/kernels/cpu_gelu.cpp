// GELU, tanh approximation (the DiT MLP's activation), fp32 on the CPU, forward and backward.
//
//   gelu(x) = ½·x·(1 + tanh u),  u = β·(x + κ·x³),  β = √(2/π),  κ = 0.044715
// and since 1 + tanh u = 2·σ(2u):
//   gelu(x)  = x·σ(2u) = x / (1 + e^(−2u))
//   gelu'(x) = σ(2u) + x·σ(2u)·(1 − σ(2u))·2β·(1 + 3κ·x²)
// one exponential per element each way (ATen evaluates tanh, the costlier function, in both).
// e^z is the Cephes single-precision scheme: z = n·ln2 + r, |r| ≤ ln2/2, a degree-7 polynomial
// for e^r, 2^n by exponent bits; ~1 ulp. This file is built with -O3 -ffp-contract=fast
// (models/CMakeLists.txt); the kernels are compiled for x86-64-v3 (AVX2 + FMA) as a region and
// supports_gelu_tanh() sends other CPUs to at::gelu.
#include "models/kernels/cpu_fused.h"

#include "models/kernels/cpu_simd.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flowtrain::models::cpu_fused {
namespace {

using namespace simd;
using v8si = int32_t __attribute__((vector_size(32)));

constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
constexpr int64_t kGrain = 32768;

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")

// e^z for z in [−87.3, 88.3] (clamped there: results saturate at ~1e−38 and ~2e38).
inline v8sf exp8(v8sf z) {
  z = z < FT_SPLAT8(-87.3f) ? FT_SPLAT8(-87.3f) : z;
  z = z > FT_SPLAT8(88.3f) ? FT_SPLAT8(88.3f) : z;
  // n = round(z / ln2): adding and subtracting 1.5·2²³ rounds to the nearest integer.
  const v8sf n = (z * FT_SPLAT8(1.44269504088896341f) + FT_SPLAT8(12582912.f)) - FT_SPLAT8(12582912.f);
  const v8sf r = (z - n * FT_SPLAT8(0.693359375f)) - n * FT_SPLAT8(-2.12194440e-4f);
  v8sf p = FT_SPLAT8(1.9875691500e-4f);
  p = p * r + FT_SPLAT8(1.3981999507e-3f);
  p = p * r + FT_SPLAT8(8.3334519073e-3f);
  p = p * r + FT_SPLAT8(4.1665795894e-2f);
  p = p * r + FT_SPLAT8(1.6666665459e-1f);
  p = p * r + FT_SPLAT8(5.0000001201e-1f);
  p = (p * (r * r) + r) + FT_SPLAT8(1.f);
  const v8si bits = (__builtin_convertvector(n, v8si) + 127) << 23;  // 2^n
  v8sf scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// σ(2u) for the GELU's u at x.
inline v8sf gate8(v8sf x) {
  const v8sf u = FT_SPLAT8(kBeta) * (x + FT_SPLAT8(kKappa) * (x * x * x));
  return FT_SPLAT8(1.f) / (FT_SPLAT8(1.f) + exp8(FT_SPLAT8(-2.f) * u));
}

float gate1(float x) {
  const float u = kBeta * (x + kKappa * (x * x * x));
  return 1.f / (1.f + std::exp(std::min(87.3f, -2.f * u)));
}

void gelu_forward(const float* x, float* y, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const v8sf v = load8(x + i);
    store8(y + i, v * gate8(v));
  }
  for (; i < end; ++i) y[i] = x[i] * gate1(x[i]);
}

void gelu_backward(const float* g, const float* x, float* dx, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const v8sf v = load8(x + i), s = gate8(v);
    const v8sf du = FT_SPLAT8(2.f * kBeta) * (FT_SPLAT8(1.f) + FT_SPLAT8(3.f * kKappa) * (v * v));
    store8(dx + i, load8(g + i) * (s + v * (s * (FT_SPLAT8(1.f) - s)) * du));
  }
  for (; i < end; ++i) {
    const float v = x[i], s = gate1(v), du = 2.f * kBeta * (1.f + 3.f * kKappa * (v * v));
    dx[i] = g[i] * (s + v * (s * (1.f - s)) * du);
  }
}

#pragma GCC pop_options

struct GeluTanhFn : torch::autograd::Function<GeluTanhFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in) {
    const at::Tensor x = x_in.contiguous();
    at::Tensor y = at::empty_like(x);
    const float* px = x.data_ptr<float>();
    float* py = y.data_ptr<float>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { gelu_forward(px, py, b, e); });
    ctx->save_for_backward({x});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dx = at::empty_like(x);
    const float *pg = g.data_ptr<float>(), *px = x.data_ptr<float>();
    float* pdx = dx.data_ptr<float>();
    at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { gelu_backward(pg, px, pdx, b, e); });
    return {dx};
  }
};

}  // namespace

bool supports_gelu_tanh(const at::Tensor& x) {
  return cpu_has_avx2_fma() && x.device().is_cpu() && x.scalar_type() == at::kFloat;
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  TORCH_CHECK(supports_gelu_tanh(x), "gelu_tanh: needs an fp32 CPU tensor on an AVX2+FMA CPU, got ", x.scalar_type(),
              " on ", x.device());
  return GeluTanhFn::apply(x);
}

}  // namespace flowtrain::models::cpu_fused
