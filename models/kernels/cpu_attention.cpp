// Multi-head attention for short sequences on the CPU, straight from the qkv projection's output.
//
// qkv is [B, N, 3, H, Dh] (row r = b·N + n holds q, k, v of every head: row stride 3·D), the
// output y is [B, N, H, Dh] = [B, N, D], the proj layer's input. Per (sample, head):
//   S = (q·kᵀ)·scale,  P = softmax(S) (ATen's kernel, over all heads at once),  y = P·v
// and backward, from ∂y (rows of D) and the saved P:
//   ∂v = Pᵀ·∂y,  ∂P = ∂y·vᵀ,  ∂S = P ⊙ (∂P − rowsum(P ⊙ ∂P)),  ∂q = scale·∂S·k,  ∂k = scale·∂Sᵀ·q
// written straight into ∂qkv's [B, N, 3, H, Dh] layout. The ATen route for these sizes
// (transposes to [B, H, N, Dh], batched GEMMs, the unbind's stack in backward) spends as long
// moving memory as multiplying; here each (sample, head) is an L1/L2-resident problem.
// This file is built with -O3 -ffp-contract=fast (models/CMakeLists.txt): a·b + c as one FMA.
#include "models/kernels/cpu_fused.h"

#include "models/kernels/cpu_simd.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

namespace flowtrain::models::cpu_fused {
namespace {

using namespace simd;

// The kernels are compiled for x86-64-v3 (AVX2 + FMA) as a whole region rather than as
// target_clones: the small GEMM helpers must be compiled for the same target as the kernels
// that inline them (GCC lowers a baseline helper's broadcasts into lane inserts).
// supports_qkv_attention() sends CPUs without AVX2/FMA to the ATen path.
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

// A block of C: rows m0..m0+MR−1, columns c0..c0+8·NV−1, C = alpha · Σ_k A(m, k)·B[k][:], where
// A(m, k) = a[m·lda + k], or a[k·lda + m] when kTransposedA. MR·NV independent accumulators
// (12 for the main block) keep both FMA pipes busy; per k, MR broadcasts and NV loads feed
// MR·NV multiply-adds.
template <bool kTransposedA, int MR, int NV>
__attribute__((always_inline)) inline void gemm_block(int64_t m0, int64_t c0, int64_t K, const v8sf& alpha,
                                                      const float* a, int64_t lda, const float* b, int64_t ldb,
                                                      float* c, int64_t ldc) {
  // (#pragma GCC unroll: the block loops must vanish so that acc lives in registers.)
  v8sf acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = FT_SPLAT8(0.f);
  for (int64_t k = 0; k < K; ++k) {
    v8sf bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = load8(b + k * ldb + c0 + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const v8sf av = FT_SPLAT8(kTransposedA ? a[k * lda + m0 + r] : a[(m0 + r) * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store8(c + (m0 + r) * ldc + c0 + 8 * v, acc[r][v] * alpha);
}

template <bool kTransposedA, int MR>
__attribute__((always_inline)) inline void gemm_rows(int64_t m0, int64_t cols, int64_t K, const v8sf& alpha,
                                                     const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                                                     int64_t ldc) {
  int64_t c0 = 0;
  for (; c0 + 16 <= cols; c0 += 16) gemm_block<kTransposedA, MR, 2>(m0, c0, K, alpha, a, lda, b, ldb, c, ldc);
  for (; c0 < cols; c0 += 8) gemm_block<kTransposedA, MR, 1>(m0, c0, K, alpha, a, lda, b, ldb, c, ldc);
}

// C[m][0:cols] = alpha · Σ_k A(m, k)·B[k][0:cols] for m < M (the sum over k in order), where
// A(m, k) = a[m·lda + k], or a[k·lda + m] when kTransposedA. cols % 8 == 0; rows of B are ldb
// apart, rows of C ldc apart. Blocks of 6 rows × 16 columns (12 accumulators), then the row
// (2, 1) and column (8) tails.
template <bool kTransposedA>
__attribute__((always_inline)) inline void small_gemm(int64_t M, int64_t cols, int64_t K, float alpha, const float* a,
                                                      int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  const v8sf valpha = FT_SPLAT8(alpha);
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) gemm_rows<kTransposedA, 6>(m, cols, K, valpha, a, lda, b, ldb, c, ldc);
  for (; m + 2 <= M; m += 2) gemm_rows<kTransposedA, 2>(m, cols, K, valpha, a, lda, b, ldb, c, ldc);
  for (; m < M; ++m) gemm_rows<kTransposedA, 1>(m, cols, K, valpha, a, lda, b, ldb, c, ldc);
}

// dst[d][j] = src[j·ld + d] for j < N, d < Dh; columns N..Np−1 zero.
__attribute__((always_inline)) inline void transpose_rows(const float* src, int64_t ld, int64_t N, int64_t Dh,
                                                          int64_t Np, float* dst) {
  for (int64_t d = 0; d < Dh; ++d) {
    float* row = dst + d * Np;
    for (int64_t j = 0; j < N; ++j) row[j] = src[j * ld + d];
    for (int64_t j = N; j < Np; ++j) row[j] = 0.f;
  }
}

struct Shape {
  int64_t N, H, Dh;
  int64_t D() const { return H * Dh; }
  int64_t Np() const { return round_up8(N); }
};

// Scores of tasks [t0, t1), task t = b·H + h: S[t] = scale·q·kᵀ, [N, N] each.
void scores_tasks(const float* qkv, float* scores, Shape s,
                                                                    float scale, int64_t t0, int64_t t1) {
  const int64_t N = s.N, D = s.D(), Np = s.Np(), ld = 3 * D;
  std::vector<float> kt(s.Dh * Np), padded(N * Np);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t b = t / s.H, h = t % s.H;
    const float* q = qkv + b * N * ld + h * s.Dh;
    transpose_rows(q + D, ld, N, s.Dh, Np, kt.data());
    small_gemm<false>(N, Np, s.Dh, scale, q, ld, kt.data(), Np, padded.data(), Np);
    float* out = scores + t * N * N;
    for (int64_t i = 0; i < N; ++i) std::memcpy(out + i * N, padded.data() + i * Np, sizeof(float) * N);
  }
}

// y[b, :, h, :] = P[t]·v for tasks [t0, t1).
void values_tasks(const float* qkv, const float* probs, float* y,
                                                                    Shape s, int64_t t0, int64_t t1) {
  const int64_t N = s.N, D = s.D(), ld = 3 * D;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t b = t / s.H, h = t % s.H;
    const float* v = qkv + b * N * ld + 2 * D + h * s.Dh;
    small_gemm<false>(N, s.Dh, N, 1.f, probs + t * N * N, N, v, ld, y + b * N * D + h * s.Dh, D);
  }
}

// ∂q, ∂k, ∂v of tasks [t0, t1) into dqkv (same layout as qkv) from ∂y and P.
void backward_tasks(const float* qkv, const float* probs,
                                                                      const float* dy, float* dqkv, Shape s,
                                                                      float scale, int64_t t0, int64_t t1) {
  const int64_t N = s.N, D = s.D(), Np = s.Np(), ld = 3 * D, N8 = N - N % 8;
  std::vector<float> vt(s.Dh * Np), ds(N * Np);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t b = t / s.H, h = t % s.H;
    const float* q = qkv + b * N * ld + h * s.Dh;
    const float *k = q + D, *v = q + 2 * D;
    float* dq = dqkv + b * N * ld + h * s.Dh;
    float *dk = dq + D, *dv = dq + 2 * D;
    const float* p = probs + t * N * N;
    const float* g = dy + b * N * D + h * s.Dh;
    small_gemm<true>(N, s.Dh, N, 1.f, p, N, g, D, dv, ld);  // ∂v = Pᵀ·∂y
    transpose_rows(v, ld, N, s.Dh, Np, vt.data());
    small_gemm<false>(N, Np, s.Dh, 1.f, g, D, vt.data(), Np, ds.data(), Np);  // ∂P = ∂y·vᵀ
    for (int64_t i = 0; i < N; ++i) {  // ∂S = P ⊙ (∂P − rowsum(P ⊙ ∂P)), in place
      const float* pi = p + i * N;
      float* di = ds.data() + i * Np;
      v8sf acc = FT_SPLAT8(0.f);
      int64_t j = 0;
      for (; j < N8; j += 8) acc += load8(pi + j) * load8(di + j);
      float r = hsum8(acc);
      for (; j < N; ++j) r += pi[j] * di[j];
      const v8sf vr = FT_SPLAT8(r);
      for (j = 0; j < N8; j += 8) store8(di + j, load8(pi + j) * (load8(di + j) - vr));
      for (; j < N; ++j) di[j] = pi[j] * (di[j] - r);
    }
    small_gemm<false>(N, s.Dh, N, scale, ds.data(), Np, k, ld, dq, ld);  // ∂q = scale·∂S·k
    small_gemm<true>(N, s.Dh, N, scale, ds.data(), Np, q, ld, dk, ld);   // ∂k = scale·∂Sᵀ·q
  }
}

#pragma GCC pop_options

struct QkvAttentionFn : torch::autograd::Function<QkvAttentionFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv_in, int64_t heads) {
    const at::Tensor qkv = qkv_in.contiguous();
    const int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3;
    const Shape s{N, heads, D / heads};
    const float scale = float(1.0 / std::sqrt(double(s.Dh)));
    at::Tensor scores = at::empty({B, heads, N, N}, qkv.options());
    const float* pqkv = qkv.data_ptr<float>();
    float* pscores = scores.data_ptr<float>();
    at::parallel_for(0, B * heads, 1, [&](int64_t t0, int64_t t1) { scores_tasks(pqkv, pscores, s, scale, t0, t1); });
    const at::Tensor probs = at::_softmax(scores, -1, /*half_to_float=*/false);
    at::Tensor y = at::empty({B, N, D}, qkv.options());
    const float* pprobs = probs.data_ptr<float>();
    float* py = y.data_ptr<float>();
    at::parallel_for(0, B * heads, 1, [&](int64_t t0, int64_t t1) { values_tasks(pqkv, pprobs, py, s, t0, t1); });
    ctx->save_for_backward({qkv, probs});
    ctx->saved_data["heads"] = heads;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &qkv = saved[0], &probs = saved[1];
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const at::Tensor dy = grads[0].contiguous();
    const int64_t B = qkv.size(0), N = qkv.size(1), D = qkv.size(2) / 3;
    const Shape s{N, heads, D / heads};
    const float scale = float(1.0 / std::sqrt(double(s.Dh)));
    at::Tensor dqkv = at::empty_like(qkv);
    const float *pqkv = qkv.data_ptr<float>(), *pprobs = probs.data_ptr<float>(), *pdy = dy.data_ptr<float>();
    float* pdqkv = dqkv.data_ptr<float>();
    at::parallel_for(0, B * heads, 1, [&](int64_t t0, int64_t t1) {
      backward_tasks(pqkv, pprobs, pdy, pdqkv, s, scale, t0, t1);
    });
    return {dqkv, at::Tensor()};
  }
};

}  // namespace

bool supports_qkv_attention(const at::Tensor& qkv, int64_t heads) {
  if (!cpu_has_avx2_fma()) return false;
  if (!qkv.device().is_cpu() || qkv.scalar_type() != at::kFloat || qkv.dim() != 3 || heads <= 0) return false;
  if (qkv.size(2) % (3 * heads) != 0) return false;
  const int64_t head_dim = qkv.size(2) / (3 * heads);
  return head_dim % 8 == 0 && qkv.size(1) >= 1 && qkv.size(1) <= kQkvAttentionMaxTokens;
}

at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads) {
  TORCH_CHECK(supports_qkv_attention(qkv, heads), "qkv_attention: needs fp32 CPU [B, N, 3·H·Dh] with Dh % 8 == 0 and N ≤ ",
              kQkvAttentionMaxTokens, ", got ", qkv.sizes(), " ", qkv.scalar_type(), " on ", qkv.device());
  return QkvAttentionFn::apply(qkv, heads);
}

}  // namespace flowtrain::models::cpu_fused
