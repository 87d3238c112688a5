#include "fused_op_table.h"

#include "models/flux/rope.h"
#include "models/kernels/cpu_fused.h"
#include "models/kernels/cuda/cuda_fused.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

namespace flowtrain::test {

namespace {

namespace cpu_fused = models::cpu_fused;
namespace cuda_fused = models::cuda_fused;

constexpr double kLayerNormEps = 1e-6;  // DiT's and Flux's adaLN LayerNorm
constexpr double kRmsNormEps = 1e-6;    // Flux's q/k RmsNorm

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (const int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

// The CPU kernels that need AVX2 + FMA (a CPU without them takes ATen's path).
bool avx2_fma() { return cpu_fused::supports_gelu_tanh(at::zeros({1})); }

// ---- the ops' own views and compositions ------------------------------------------------------

// adaLN: shift and scale are strided chunks of one [B, 3·D] modulation tensor, as the adaLN
// linear's output gives them; the gate is its third chunk.
at::Tensor shift_of(const at::Tensor& mod) { return mod.narrow(1, 0, mod.size(1) / 3); }
at::Tensor scale_of(const at::Tensor& mod) { return mod.narrow(1, mod.size(1) / 3, mod.size(1) / 3); }
at::Tensor gate_of(const at::Tensor& mod) { return mod.narrow(1, 2 * mod.size(1) / 3, mod.size(1) / 3); }

// Tokens [B, N, D]: odd widths (scalar paths and the CPU's 8-lane tail), a multiple of 8 (vector
// paths), N = 70 (two of the CPU's row blocks), one token, DiT-XL's and Flux's widths, and an odd
// width past 1,024 (CUDA's scalar path with the most elements a thread).
const std::vector<std::array<int64_t, 3>> kTokenShapes = {{3, 70, 20}, {3, 17, 37}, {3, 17, 40},
                                                          {2, 1, 1152}, {2, 9, 3072}, {2, 3, 1153}};

// One case per token shape, its inputs made by `make(B, N, D)` after seeding the generator.
std::vector<OpCase> token_cases(uint64_t seed, std::function<std::vector<OpInput>(int64_t, int64_t, int64_t)> make) {
  std::vector<OpCase> cases;
  for (const auto& [B, N, D] : kTokenShapes)
    cases.emplace_back(dims({B, N, D}), [seed, make, B = B, N = N, D = D] {
      at::manual_seed(seed);
      return make(B, N, D);
    });
  return cases;
}

FusedOp adaln_modulate_op() {
  FusedOp op;
  op.name = "adaln_modulate";
  op.cases = token_cases(0, [](int64_t B, int64_t N, int64_t D) {
    // a non-zero mean exercises the two-pass variance
    return std::vector<OpInput>{{at::randn({B, N, D}) * 2 + 0.5}, {at::randn({B, 3 * D}) * 0.5}};
  });
  op.reference = [](const std::vector<at::Tensor>& in, const Params&) {
    const int64_t D = in[0].size(-1);
    return at::layer_norm(in[0], {D}, {}, {}, kLayerNormEps) * (1 + scale_of(in[1]).unsqueeze(1)) +
           shift_of(in[1]).unsqueeze(1);
  };
  op.kernels["cpu"] = {[](const std::vector<at::Tensor>& in, const Params&) {
                         const at::Tensor shift = shift_of(in[1]), scale = scale_of(in[1]);
                         return cpu_fused::supports(in[0], {&shift, &scale});
                       },
                       [](const std::vector<at::Tensor>& in, const Params&) {
                         return cpu_fused::adaln_modulate(in[0], shift_of(in[1]), scale_of(in[1]), kLayerNormEps);
                       }};
  op.kernels["cuda"] = {[](const std::vector<at::Tensor>& in, const Params&) {
                          return cuda_fused::supports_adaln_modulate(in[0], shift_of(in[1]), scale_of(in[1]));
                        },
                        [](const std::vector<at::Tensor>& in, const Params&) {
                          return cuda_fused::adaln_modulate(in[0], shift_of(in[1]), scale_of(in[1]), kLayerNormEps);
                        }};
  return op;
}

FusedOp gated_residual_op() {
  FusedOp op;
  op.name = "gated_residual";
  op.cases = token_cases(1, [](int64_t B, int64_t N, int64_t D) {
    return std::vector<OpInput>{{at::randn({B, N, D})}, {at::randn({B, 3 * D})}, {at::randn({B, N, D})}};
  });
  op.reference = [](const std::vector<at::Tensor>& in, const Params&) { return in[0] + gate_of(in[1]).unsqueeze(1) * in[2]; };
  op.kernels["cpu"] = {[](const std::vector<at::Tensor>& in, const Params&) {
                         const at::Tensor gate = gate_of(in[1]);
                         return cpu_fused::supports(in[0], {&gate}, &in[2]);
                       },
                       [](const std::vector<at::Tensor>& in, const Params&) {
                         return cpu_fused::gated_residual(in[0], gate_of(in[1]), in[2]);
                       }};
  op.kernels["cuda"] = {[](const std::vector<at::Tensor>& in, const Params&) {
                          return cuda_fused::supports_gated_residual(in[0], gate_of(in[1]), in[2]);
                        },
                        [](const std::vector<at::Tensor>& in, const Params&) {
                          return cuda_fused::gated_residual(in[0], gate_of(in[1]), in[2]);
                        }};
  return op;
}

// Attention straight from the qkv projection's output [B, N, 3·H·Dh] (timm's [B, N, 3, H, Dh]),
// heads concatenated back to [B, N, H·Dh]. N = 9, 49 and the limit (64) cover the CPU kernel's
// 8-lane tails and its 6-, 2- and 1-row blocks; Dh = 8 and 40 its 16- and 8-column blocks.
FusedOp qkv_attention_op() {
  FusedOp op;
  op.name = "qkv_attention";
  const std::vector<std::array<int64_t, 3>> shapes = {{9, 3, 8}, {49, 2, 40}, {cpu_fused::kQkvAttentionMaxTokens, 2, 8}};
  for (const auto& [N, H, Dh] : shapes)
    op.cases.push_back({"N=" + std::to_string(N) + " H=" + std::to_string(H) + " Dh=" + std::to_string(Dh),
                        [N = N, H = H, Dh = Dh] {
                          at::manual_seed(9);
                          return std::vector<OpInput>{{at::randn({2, N, 3 * H * Dh})}};
                        },
                        {H}});
  op.reference = [](const std::vector<at::Tensor>& in, const Params& heads) {
    const int64_t B = in[0].size(0), N = in[0].size(1), H = heads[0], D = in[0].size(2) / 3, Dh = D / H;
    auto parts = in[0].view({B, N, 3, H, Dh}).unbind(2);  // q, k, v [B, N, H, Dh]
    at::Tensor q = parts[0].transpose(1, 2), k = parts[1].transpose(1, 2), v = parts[2].transpose(1, 2);
    at::Tensor p = at::softmax(at::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(Dh)), -1);
    return at::matmul(p, v).transpose(1, 2).reshape({B, N, D});
  };
  op.kernels["cpu"] = {[](const std::vector<at::Tensor>& in, const Params& heads) {
                         return cpu_fused::supports_qkv_attention(in[0], heads[0]);
                       },
                       [](const std::vector<at::Tensor>& in, const Params& heads) {
                         return cpu_fused::qkv_attention(in[0], heads[0]);
                       },
                       avx2_fma};
  return op;
}

// GELU (tanh) over x in [−12, 12]: both saturated tails and the curved middle, and a length that
// is not a multiple of 8 (the scalar tail).
FusedOp gelu_tanh_op() {
  FusedOp op;
  op.name = "gelu_tanh";
  op.cases.push_back({"100003 points in [-12, 12]", [] {
                        return std::vector<OpInput>{{at::linspace(-12, 12, 100003)}};
                      }});
  op.reference = [](const std::vector<at::Tensor>& in, const Params&) { return at::gelu(in[0], "tanh"); };
  op.kernels["cpu"] = {[](const std::vector<at::Tensor>& in, const Params&) { return cpu_fused::supports_gelu_tanh(in[0]); },
                       [](const std::vector<at::Tensor>& in, const Params&) { return cpu_fused::gelu_tanh(in[0]); },
                       avx2_fma};
  return op;
}

// q/k as attention gets them, [B, H, L, Dh]: contiguous, or a strided view of the key in a qkv
// tensor [B, L, 3, H, Dh].
at::Tensor heads_view(const at::Tensor& base, bool strided) {
  return strided ? base.select(2, 1).permute({0, 2, 1, 3}) : base;
}
at::Tensor heads_base(int64_t B, int64_t H, int64_t L, int64_t Dh, bool strided) {
  return strided ? at::randn({B, L, 3, H, Dh}) : at::randn({B, H, L, Dh});
}

// Flux's RoPE: x [B, H, L, Dh] (the leaf may be a qkv tensor: the view is the strided key),
// angles [B or 1, L, Dh/2, 2] fp32 without a gradient. Dh = 1022: one pair a thread, 511 threads.
FusedOp rope_op() {
  FusedOp op;
  op.name = "rope";
  const int64_t B = 2, H = 3, L = 5;
  for (const int64_t Dh : {int64_t{38}, int64_t{128}, int64_t{1022}})
    for (const bool strided : {false, true})
      for (const int64_t angle_batch : {B, int64_t{1}})
        op.cases.push_back({"Dh=" + std::to_string(Dh) + (strided ? " strided" : "") + " angle batch " +
                                std::to_string(angle_batch),
                            [=] {
                              at::manual_seed(2);
                              at::Tensor base = heads_base(B, H, L, Dh, strided);
                              const at::Tensor theta = at::rand({angle_batch, L, Dh / 2}) * 20 - 10;
                              at::Tensor angles = at::stack({at::cos(theta), at::sin(theta)}, -1);
                              return std::vector<OpInput>{{base}, {angles, false, false}};
                            }});
  auto x_of = [](const at::Tensor& base) { return heads_view(base, base.dim() == 5); };
  op.reference = [x_of](const std::vector<at::Tensor>& in, const Params&) { return models::apply_rope(x_of(in[0]), in[1]); };
  op.kernels["cuda"] = {[x_of](const std::vector<at::Tensor>& in, const Params&) { return cuda_fused::supports_rope(x_of(in[0]), in[1]); },
                        [x_of](const std::vector<at::Tensor>& in, const Params&) { return cuda_fused::apply_rope(x_of(in[0]), in[1]); }};
  return op;
}

// Flux's q/k RmsNorm, x·rsqrt(mean(x²) + eps)·weight over the last axis: x contiguous 4-D, a
// strided 4-D view, or 2-D rows; weight fp32 with a gradient. Dh = 255: the scalar path, 8 items
// a thread.
FusedOp qk_rmsnorm_op() {
  FusedOp op;
  op.name = "qk_rmsnorm";
  const int64_t B = 2, H = 3, L = 5;
  for (const int64_t Dh : {int64_t{37}, int64_t{128}, int64_t{255}})
    for (const int mode : {0, 1, 2})  // contiguous 4-D, strided 4-D, 2-D rows
      op.cases.push_back({"Dh=" + std::to_string(Dh) + (mode == 0 ? " 4-D" : mode == 1 ? " strided 4-D" : " 2-D"), [=] {
                            at::manual_seed(3);
                            at::Tensor base = mode == 2 ? at::randn({B * H * L, Dh}) : heads_base(B, H, L, Dh, mode == 1);
                            return std::vector<OpInput>{{base}, {1 + 0.1 * at::randn({Dh}), true, false}};
                          }});
  auto x_of = [](const at::Tensor& base) { return base.dim() == 2 ? base : heads_view(base, base.dim() == 5); };
  op.reference = [x_of](const std::vector<at::Tensor>& in, const Params&) {
    const at::Tensor x = x_of(in[0]);
    return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kRmsNormEps) * in[1];
  };
  op.kernels["cuda"] = {
      [x_of](const std::vector<at::Tensor>& in, const Params&) { return cuda_fused::supports_qk_rmsnorm(x_of(in[0]), in[1]); },
      [x_of](const std::vector<at::Tensor>& in, const Params&) { return cuda_fused::qk_rmsnorm(x_of(in[0]), in[1], kRmsNormEps); }};
  return op;
}

std::string dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : dtype == at::kBFloat16 ? "bf16" : "other";
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": no value";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.detach().cpu().to(at::kDouble), w = want.detach().to(at::kDouble);
  EXPECT_FALSE(at::isnan(g).any().item<bool>()) << what << ": NaN (an element never written?)";
  const double err = ((g - w).norm() / w.norm().clamp_min(1e-300)).item<double>();
  EXPECT_LT(err, tol) << what << ": relative error " << err;
}

}  // namespace

double tolerance(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 1e-2; }

void poison_cuda_blocks(std::initializer_list<int64_t> bytes) {
  std::vector<at::Tensor> blocks;  // allocated, filled with 0xFF bytes, freed when this returns
  for (const int64_t b : bytes)
    blocks.push_back(at::full({std::max<int64_t>(b, 1)}, 255, at::device(at::kCUDA).dtype(at::kByte)));
}

const std::vector<FusedOp>& fused_ops() {
  static const std::vector<FusedOp> ops = {adaln_modulate_op(), gated_residual_op(), qkv_attention_op(),
                                           gelu_tanh_op(),      rope_op(),           qk_rmsnorm_op()};
  return ops;
}

const Backend& backend(const std::string& name) {
  static const std::vector<Backend> backends = {
      // The CPU kernels are fp32 and use AVX2 + FMA where present; each op's supports says so.
      {"cpu", c10::Device(c10::kCPU), {at::kFloat}, [] { return true; }, {}},
      {"cuda",
       c10::Device(c10::kCUDA),
       {at::kFloat, at::kBFloat16, at::kHalf},
       [] {
#if defined(FLOWTRAIN_HAVE_CUDA_KERNELS)
         return at::hasCUDA();
#else
         return false;
#endif
       },
       poison_cuda_blocks},
  };
  for (const Backend& b : backends)
    if (b.name == name) return b;
  throw std::invalid_argument("no backend '" + name + "' in the fused-op table");
}

std::vector<std::string> ops_of_backend(const std::string& backend_name) {
  std::vector<std::string> names;
  for (const FusedOp& op : fused_ops())
    if (op.kernels.count(backend_name)) names.push_back(op.name);
  return names;
}

void check_op_on_backend(const std::string& op_name, const std::string& backend_name) {
  const auto op = std::find_if(fused_ops().begin(), fused_ops().end(), [&](const FusedOp& o) { return o.name == op_name; });
  ASSERT_NE(op, fused_ops().end()) << op_name;
  check_op_on_backend(*op, backend_name);
}

void check_op_on_backend(const FusedOp& op, const std::string& backend_name) {
  const std::string& op_name = op.name;
  const Backend& be = backend(backend_name);
  const OpKernel& kernel = op.kernels.at(backend_name);
  if (kernel.available && !kernel.available()) GTEST_SKIP() << op_name << ": this " << backend_name << " lacks what the kernel needs";
  for (const at::ScalarType dtype : be.dtypes) {
    for (const OpCase& c : op.cases) {
      SCOPED_TRACE(op_name + " on " + backend_name + ", " + dtype_name(dtype) + ", " + c.label);
      const std::vector<OpInput> inputs = c.make();
      // The kernel's operands and the reference's: the same values, rounded to the run's dtype.
      std::vector<at::Tensor> leaves, leaves64;
      for (const OpInput& in : inputs) {
        const at::Tensor rounded = in.follows_dtype ? in.value.to(dtype) : in.value;
        leaves.push_back(rounded.to(be.device).detach().requires_grad_(in.differentiable));
        leaves64.push_back(rounded.to(at::kDouble).detach().requires_grad_(in.differentiable));
      }
      ASSERT_TRUE(kernel.supports(leaves, c.params)) << "the kernel declines a case of its own table";
      const at::Tensor want = op.reference(leaves64, c.params);
      at::manual_seed(7);
      const at::Tensor upstream = at::randn(want.sizes()).to(dtype);
      want.backward(upstream.to(at::kDouble));

      std::vector<int64_t> sizes;
      for (const at::Tensor& l : leaves) sizes.push_back(l.nbytes());
      if (be.poison) be.poison({sizes.front(), int64_t(upstream.nbytes()), upstream.numel() / upstream.size(-1) * 8});
      const at::Tensor got = kernel.run(leaves, c.params);
      EXPECT_EQ(got.scalar_type(), dtype) << "output dtype";
      if (be.poison) be.poison({int64_t(upstream.nbytes()), sizes.front()});
      got.backward(upstream.to(be.device));

      const double tol = tolerance(dtype);
      expect_close(got, want, tol, "output");
      for (size_t i = 0; i < leaves.size(); ++i)
        if (inputs[i].differentiable) expect_close(leaves[i].grad(), leaves64[i].grad(), tol, "grad of input " + std::to_string(i));
    }
  }
}

}  // namespace flowtrain::test
