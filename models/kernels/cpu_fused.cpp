#include "models/kernels/cpu_fused.h"

#include "models/kernels/cpu_simd.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace flowtrain::models::cpu_fused {

// Tokens x, y, g are contiguous [B, N, D] (row r = b·N + n); the per-sample vectors shift, scale,
// gate are rows of [B, D] views with unit inner stride (chunks of the adaLN linear's output, row
// stride `mod_stride`). fp32 throughout, the same operation order as the ATen composition
// (x̂ = (x − μ)·σ⁻¹, then x̂·(1 + scale), then + shift; x + gate·y), no FMA contraction (ISO C++
// mode), so the forward differs from the composition only in how μ and σ² are summed.
// Reductions over tokens (∂shift, ∂scale, ∂gate) go through per-task partial sums of
// kRowsPerTask tokens, a split that does not depend on the thread count: results are the same
// for any number of threads.
namespace {

using namespace simd;
constexpr int64_t kRowsPerTask = 64;

// y = LN(x)·(1 + scale_b) + shift_b for rows [r0, r1); also μ and σ⁻¹ per row.
__attribute__((target_clones("avx2", "default"))) void adaln_forward_rows(
    const float* x, const float* shift, const float* scale, int64_t mod_stride, float* y, float* mean,
    float* rstd, int64_t N, int64_t D, float eps, int64_t r0, int64_t r1) {
  const int64_t D8 = D - D % 8;
  const v8sf one = FT_SPLAT8(1.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const float* sh = shift + (r / N) * mod_stride;
    const float* sc = scale + (r / N) * mod_stride;
    v8sf acc = FT_SPLAT8(0.0f);
    int64_t d = 0;
    for (; d < D8; d += 8) acc += load8(xr + d);
    float sum = hsum8(acc);
    for (; d < D; ++d) sum += xr[d];
    const float m = sum / float(D);
    const v8sf vm = FT_SPLAT8(m);
    acc = FT_SPLAT8(0.0f);
    for (d = 0; d < D8; d += 8) {
      const v8sf c = load8(xr + d) - vm;
      acc += c * c;
    }
    float sq = hsum8(acc);
    for (; d < D; ++d) sq += (xr[d] - m) * (xr[d] - m);
    const float rs = 1.0f / std::sqrt(sq / float(D) + eps);
    const v8sf vr = FT_SPLAT8(rs);
    for (d = 0; d < D8; d += 8)
      store8(yr + d, ((load8(xr + d) - vm) * vr) * (one + load8(sc + d)) + load8(sh + d));
    for (; d < D; ++d) yr[d] = ((xr[d] - m) * rs) * (1.0f + sc[d]) + sh[d];
    mean[r] = m;
    rstd[r] = rs;
  }
}

// Backward of adaln_forward_rows for rows [r0, r1) of one sample (scale = that sample's row):
// ∂x = σ⁻¹·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) with ĝ = g·(1 + scale), and the partial sums over these
// rows of ∂shift = g and ∂scale = g·x̂ into dshift/dscale [D] (overwritten).
__attribute__((target_clones("avx2", "default"))) void adaln_backward_rows(
    const float* g, const float* x, const float* mean, const float* rstd, const float* scale, float* dx,
    float* dshift, float* dscale, int64_t D, int64_t r0, int64_t r1) {
  const int64_t D8 = D - D % 8;
  const v8sf one = FT_SPLAT8(1.0f);
  std::memset(dshift, 0, sizeof(float) * D);
  std::memset(dscale, 0, sizeof(float) * D);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * D;
    const float* xr = x + r * D;
    float* dxr = dx + r * D;
    const float m = mean[r], rs = rstd[r];
    const v8sf vm = FT_SPLAT8(m), vr = FT_SPLAT8(rs);
    v8sf a1 = FT_SPLAT8(0.0f), a2 = FT_SPLAT8(0.0f);
    int64_t d = 0;
    for (; d < D8; d += 8) {
      const v8sf gg = load8(gr + d), xh = (load8(xr + d) - vm) * vr, gh = gg * (one + load8(scale + d));
      a1 += gh;
      a2 += gh * xh;
      store8(dshift + d, load8(dshift + d) + gg);
      store8(dscale + d, load8(dscale + d) + gg * xh);
    }
    float s1 = hsum8(a1), s2 = hsum8(a2);
    for (; d < D; ++d) {
      const float xh = (xr[d] - m) * rs, gh = gr[d] * (1.0f + scale[d]);
      s1 += gh;
      s2 += gh * xh;
      dshift[d] += gr[d];
      dscale[d] += gr[d] * xh;
    }
    const float c1 = s1 / float(D), c2 = s2 / float(D);
    const v8sf vc1 = FT_SPLAT8(c1), vc2 = FT_SPLAT8(c2);
    for (d = 0; d < D8; d += 8) {
      const v8sf xh = (load8(xr + d) - vm) * vr, gh = load8(gr + d) * (one + load8(scale + d));
      store8(dxr + d, vr * ((gh - vc1) - xh * vc2));
    }
    for (; d < D; ++d) {
      const float xh = (xr[d] - m) * rs, gh = gr[d] * (1.0f + scale[d]);
      dxr[d] = rs * ((gh - c1) - xh * c2);
    }
  }
}

// out = x + gate_b·y for rows [r0, r1).
__attribute__((target_clones("avx2", "default"))) void gated_forward_rows(
    const float* x, const float* gate, int64_t mod_stride, const float* y, float* out, int64_t N, int64_t D,
    int64_t r0, int64_t r1) {
  const int64_t D8 = D - D % 8;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gt = gate + (r / N) * mod_stride;
    const int64_t o = r * D;
    int64_t d = 0;
    for (; d < D8; d += 8) store8(out + o + d, load8(x + o + d) + load8(gt + d) * load8(y + o + d));
    for (; d < D; ++d) out[o + d] = x[o + d] + gt[d] * y[o + d];
  }
}

// ∂y = g·gate and the partial sum over rows [r0, r1) (one sample) of ∂gate = g·y into dgate [D].
__attribute__((target_clones("avx2", "default"))) void gated_backward_rows(
    const float* g, const float* gate, const float* y, float* dy, float* dgate, int64_t D, int64_t r0, int64_t r1) {
  const int64_t D8 = D - D % 8;
  std::memset(dgate, 0, sizeof(float) * D);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * D;
    int64_t d = 0;
    for (; d < D8; d += 8) {
      const v8sf gg = load8(g + o + d);
      store8(dy + o + d, gg * load8(gate + d));
      store8(dgate + d, load8(dgate + d) + gg * load8(y + o + d));
    }
    for (; d < D; ++d) {
      dy[o + d] = g[o + d] * gate[d];
      dgate[d] += g[o + d] * y[o + d];
    }
  }
}

at::Tensor unit_inner_stride(const at::Tensor& t) { return t.stride(1) == 1 ? t : t.contiguous(); }

// Runs `task(b, r0, r1)` over every sample b and block of kRowsPerTask of its N rows; task
// index i = b·tasks_per_sample + k writes partial sums into row i of a [B·tasks, D] buffer.
template <typename F>
void for_each_row_block(int64_t B, int64_t N, const F& task) {
  const int64_t per_sample = (N + kRowsPerTask - 1) / kRowsPerTask;
  at::parallel_for(0, B * per_sample, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / per_sample, k = i % per_sample;
      task(i, b, b * N + k * kRowsPerTask, b * N + std::min(N, (k + 1) * kRowsPerTask));
    }
  });
}

// [B·tasks, D] partial sums -> [B, D]
at::Tensor reduce_row_blocks(const at::Tensor& partial, int64_t B, int64_t N) {
  const int64_t per_sample = (N + kRowsPerTask - 1) / kRowsPerTask;
  if (per_sample == 1) return partial;
  return partial.view({B, per_sample, partial.size(1)}).sum(1);
}

int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, D)); }

struct AdaLNModulateFn : torch::autograd::Function<AdaLNModulateFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& shift_in,
                            const at::Tensor& scale_in, double eps) {
    const at::Tensor x = x_in.contiguous();
    at::Tensor shift = unit_inner_stride(shift_in), scale = unit_inner_stride(scale_in);
    if (shift.stride(0) != scale.stride(0)) {  // the kernel takes one row stride for both
      shift = shift.contiguous();
      scale = scale.contiguous();
    }
    const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
    at::Tensor y = at::empty({B, N, D}, x.options());
    at::Tensor mean = at::empty({B * N}, x.options()), rstd = at::empty({B * N}, x.options());
    const float *px = x.data_ptr<float>(), *psh = shift.data_ptr<float>(), *psc = scale.data_ptr<float>();
    float *py = y.data_ptr<float>(), *pm = mean.data_ptr<float>(), *pr = rstd.data_ptr<float>();
    const int64_t mod_stride = scale.stride(0);
    at::parallel_for(0, B * N, row_grain(D), [&](int64_t r0, int64_t r1) {
      adaln_forward_rows(px, psh, psc, mod_stride, py, pm, pr, N, D, float(eps), r0, r1);
    });
    ctx->save_for_backward({x, mean, rstd, scale});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &mean = saved[1], &rstd = saved[2], &scale = saved[3];
    const at::Tensor g = grads[0].contiguous();
    const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
    const int64_t tasks = B * ((N + kRowsPerTask - 1) / kRowsPerTask);
    at::Tensor dx = at::empty_like(x);
    at::Tensor dshift = at::empty({tasks, D}, x.options()), dscale = at::empty({tasks, D}, x.options());
    const float *pg = g.data_ptr<float>(), *px = x.data_ptr<float>(), *pm = mean.data_ptr<float>(),
                *pr = rstd.data_ptr<float>(), *psc = scale.data_ptr<float>();
    float *pdx = dx.data_ptr<float>(), *pdsh = dshift.data_ptr<float>(), *pdsc = dscale.data_ptr<float>();
    const int64_t mod_stride = scale.stride(0);
    for_each_row_block(B, N, [&](int64_t i, int64_t b, int64_t r0, int64_t r1) {
      adaln_backward_rows(pg, px, pm, pr, psc + b * mod_stride, pdx, pdsh + i * D, pdsc + i * D, D, r0, r1);
    });
    return {dx, reduce_row_blocks(dshift, B, N), reduce_row_blocks(dscale, B, N), at::Tensor()};
  }
};

struct GatedResidualFn : torch::autograd::Function<GatedResidualFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& gate_in,
                            const at::Tensor& y_in) {
    const at::Tensor x = x_in.contiguous(), gate = unit_inner_stride(gate_in), y = y_in.contiguous();
    const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
    at::Tensor out = at::empty({B, N, D}, x.options());
    const float *px = x.data_ptr<float>(), *pgt = gate.data_ptr<float>(), *py = y.data_ptr<float>();
    float* po = out.data_ptr<float>();
    const int64_t mod_stride = gate.stride(0);
    at::parallel_for(0, B * N, row_grain(D), [&](int64_t r0, int64_t r1) {
      gated_forward_rows(px, pgt, mod_stride, py, po, N, D, r0, r1);
    });
    ctx->save_for_backward({gate, y});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &gate = saved[0], &y = saved[1];
    const at::Tensor g = grads[0].contiguous();
    const int64_t B = y.size(0), N = y.size(1), D = y.size(2);
    const int64_t tasks = B * ((N + kRowsPerTask - 1) / kRowsPerTask);
    at::Tensor dy = at::empty_like(y), dgate = at::empty({tasks, D}, y.options());
    const float *pg = g.data_ptr<float>(), *pgt = gate.data_ptr<float>(), *py = y.data_ptr<float>();
    float *pdy = dy.data_ptr<float>(), *pdg = dgate.data_ptr<float>();
    const int64_t mod_stride = gate.stride(0);
    for_each_row_block(B, N, [&](int64_t i, int64_t b, int64_t r0, int64_t r1) {
      gated_backward_rows(pg, pgt + b * mod_stride, py, pdy, pdg + i * D, D, r0, r1);
    });
    return {grads[0], reduce_row_blocks(dgate, B, N), dy};
  }
};

}  // namespace

bool supports(const at::Tensor& tokens, std::initializer_list<const at::Tensor*> per_sample,
              const at::Tensor* other_tokens) {
  auto fp32_cpu = [](const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; };
  if (!fp32_cpu(tokens) || tokens.dim() != 3) return false;
  if (other_tokens && (!fp32_cpu(*other_tokens) || other_tokens->sizes() != tokens.sizes())) return false;
  for (const at::Tensor* v : per_sample) {
    if (!fp32_cpu(*v) || v->dim() != 2 || v->size(0) != tokens.size(0) || v->size(1) != tokens.size(2)) return false;
  }
  return true;
}

at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return AdaLNModulateFn::apply(x, shift, scale, eps);
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return GatedResidualFn::apply(x, gate, y);
}

}  // namespace flowtrain::models::cpu_fused
