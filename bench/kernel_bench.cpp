// flowtrain_kernel_bench: each fused CUDA kernel (models/kernels/cuda/cuda_fused.h), forward and
// backward, against the unfused ATen sequence it replaces, at Flux sizes in bf16 (tokens
// 8 × 4096 × 3072, heads 8 × 24 × 4096 × 128, fp8 operands 32768 × 3072).
// Timing: CUDA events around each call on the current stream, 5 warm-ups, the median of
// --reps (default 30) calls; backward passes through torch::autograd::grad with the graph retained
// (no gradient accumulation). Bandwidth: the minimum bytes the op must move (every input read
// once, every output written once) over the median time, and its fraction of the device-to-device
// copy bandwidth measured the same way (dst.copy_(src), 1 GiB: 2 GiB moved).
// Output: one JSON line per measurement (the copy first), then a table. Exit 2 without a GPU.
#include "models/flux/rope.h"
#include "models/kernels/cuda/cuda_fused.h"
#include "models/kernels/fp8_cast_reference.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fused = flowtrain::models::cuda_fused;
namespace ref = flowtrain::models::fp8_reference;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Event {  // RAII for a cudaEvent_t
  cudaEvent_t e{};
  Event() { check(cudaEventCreate(&e), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

int g_reps = 30;

// Median GPU time of fn in milliseconds.
double median_ms(const std::function<void()>& fn) {
  for (int i = 0; i < 5; ++i) fn();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  std::vector<Event> start(g_reps), stop(g_reps);
  for (int r = 0; r < g_reps; ++r) {
    check(cudaEventRecord(start[r].e, stream), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop[r].e, stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<double> ms(g_reps);
  for (int r = 0; r < g_reps; ++r) {
    float t = 0;
    check(cudaEventElapsedTime(&t, start[r].e, stop[r].e), "cudaEventElapsedTime");
    ms[r] = t;
  }
  std::nth_element(ms.begin(), ms.begin() + g_reps / 2, ms.end());
  return ms[g_reps / 2];
}

struct Row {
  std::string kernel, pass, shape;
  double bytes, fused_ms, aten_ms;
};

double g_copy_gbps = 0;
std::vector<Row> g_rows;

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

void report(const std::string& kernel, const std::string& pass, const std::string& shape, double bytes,
            const std::function<void()>& fused_fn, const std::function<void()>& aten_fn) {
  const double f = median_ms(fused_fn), a = median_ms(aten_fn);
  g_rows.push_back({kernel, pass, shape, bytes, f, a});
  std::printf("{\"kernel\": \"%s\", \"pass\": \"%s\", \"shape\": \"%s\", \"dtype\": \"bf16\", \"bytes\": %.0f, "
              "\"fused_ms\": %.4f, \"aten_ms\": %.4f, \"speedup\": %.2f, \"fused_gbps\": %.1f, \"aten_gbps\": %.1f, "
              "\"copy_gbps\": %.1f, \"copy_fraction\": %.3f}\n",
              kernel.c_str(), pass.c_str(), shape.c_str(), bytes, f, a, a / f, gbps(bytes, f), gbps(bytes, a),
              g_copy_gbps, gbps(bytes, f) / g_copy_gbps);
  std::fflush(stdout);
}

// Forward and backward of a differentiable op: `make` builds the output from the inputs (with
// autograd recording), the gradients are taken for `inputs`.
void report_op(const std::string& kernel, const std::string& shape, double fwd_bytes, double bwd_bytes,
               const std::vector<at::Tensor>& inputs, const std::function<at::Tensor()>& fused_op,
               const std::function<at::Tensor()>& aten_op) {
  {
    at::NoGradGuard no_grad;
    report(kernel, "forward", shape, fwd_bytes, [&] { fused_op(); }, [&] { aten_op(); });
  }
  const at::Tensor fy = fused_op(), ay = aten_op();
  const at::Tensor g = at::randn_like(fy);
  auto backward = [&](const at::Tensor& y) {
    torch::autograd::grad({y}, inputs, {g}, /*retain_graph=*/true);
  };
  report(kernel, "backward", shape, bwd_bytes, [&] { backward(fy); }, [&] { backward(ay); });
}

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (const int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) g_reps = std::max(1, std::atoi(argv[i + 1]));
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "flowtrain_kernel_bench: no CUDA device on this machine; it benchmarks the fused CUDA kernels\n");
    return 2;
  }
  try {
    at::manual_seed(0);
    const auto bf16 = at::device(at::kCUDA).dtype(at::kBFloat16);
    constexpr double kBf16 = 2, kF32 = 4;

    {  // the yardstick: a device-to-device copy of 1 GiB
      const int64_t n = int64_t(1) << 30;
      at::Tensor src = at::empty({n}, at::device(at::kCUDA).dtype(at::kByte)).fill_(1), dst = at::empty_like(src);
      const double ms = median_ms([&] { dst.copy_(src); });
      g_copy_gbps = gbps(2.0 * n, ms);
      cudaDeviceProp prop{};
      check(cudaGetDeviceProperties(&prop, c10::cuda::current_device()), "cudaGetDeviceProperties");
      std::printf("{\"kernel\": \"copy\", \"device\": \"%s\", \"bytes\": %.0f, \"ms\": %.4f, \"copy_gbps\": %.1f}\n",
                  prop.name, 2.0 * n, ms, g_copy_gbps);
    }

    const int64_t B = 8, N = 4096, D = 3072;  // Flux-dev tokens (4096 image tokens at 1024², hidden 3072)
    const double tok = double(B) * N * D;
    {
      at::Tensor x = at::randn({B, N, D}, bf16).requires_grad_();
      at::Tensor mod = at::randn({B, 6 * D}, bf16).requires_grad_();  // the adaLN linear's output
      const at::Tensor shift = mod.narrow(1, 0, D), scale = mod.narrow(1, D, D);
      const double eps = 1e-6;
      report_op("adaln_modulate", dims({B, N, D}),
                /*fwd: x, shift, scale → y, μ, σ⁻¹*/ kBf16 * (2 * tok + 2 * B * D) + kF32 * 2 * B * N,
                /*bwd: g, x, scale, μ, σ⁻¹ → dx, dshift, dscale*/ kBf16 * (3 * tok + 3 * B * D) + kF32 * 2 * B * N,
                {x, mod}, [&] { return fused::adaln_modulate(x, shift, scale, eps); },
                [&] {
                  return at::layer_norm(x, {D}, {}, {}, eps) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
                });

      at::Tensor y = at::randn({B, N, D}, bf16).requires_grad_();
      const at::Tensor gate = mod.narrow(1, 2 * D, D);
      report_op("gated_residual", dims({B, N, D}),
                /*fwd: x, y, gate → out*/ kBf16 * (3 * tok + B * D),
                /*bwd: g, y, gate → dy, dgate (dx is g)*/ kBf16 * (3 * tok + 2 * B * D), {x, y, mod},
                [&] { return fused::gated_residual(x, gate, y); }, [&] { return x + gate.unsqueeze(1) * y; });
    }

    const int64_t H = 24, L = 4096, Dh = 128;  // Flux-dev heads
    const double heads = double(B) * H * L * Dh;
    {
      at::Tensor q = at::randn({B, H, L, Dh}, bf16).requires_grad_();
      const at::Tensor theta = at::rand({B, L, Dh / 2}, at::device(at::kCUDA)) * 100;
      const at::Tensor angles = at::stack({at::cos(theta), at::sin(theta)}, -1);
      const double angle_bytes = kF32 * B * L * Dh;
      report_op("apply_rope", dims({B, H, L, Dh}), kBf16 * 2 * heads + angle_bytes, kBf16 * 2 * heads + angle_bytes,
                {q}, [&] { return fused::apply_rope(q, angles); },
                [&] { return flowtrain::models::apply_rope(q, angles); });

      at::Tensor w = at::ones({Dh}, at::device(at::kCUDA)).requires_grad_();
      const double rows = double(B) * H * L;
      report_op("qk_rmsnorm", dims({B, H, L, Dh}),
                /*fwd: x, w → y, rrms*/ kBf16 * 2 * heads + kF32 * (rows + Dh),
                /*bwd: g, x, rrms, w → dx, dw*/ kBf16 * 3 * heads + kF32 * (rows + 2 * Dh), {q, w},
                [&] { return fused::qk_rmsnorm(q, w); },
                [&] {  // models/flux/flux.cpp RmsNorm, then QkNorm's cast to v's dtype
                  const at::Tensor xf = q.to(at::kFloat);
                  return ((xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16) * w).to(at::kBFloat16);
                });
    }

    const int64_t M = B * N, K = D;  // a linear's input, flattened
    const double mk = double(M) * K;
    {
      at::NoGradGuard no_grad;
      const at::Tensor x = at::randn({M, K}, bf16);
      const at::Tensor scale = at::full({}, 448.0f / 5, at::device(at::kCUDA));
      at::Tensor amax_slot = at::zeros({}, at::device(at::kCUDA));
      const std::string shape = dims({M, K});
      report("amax", "forward", shape, kBf16 * mk, [&] { fused::amax(x); }, [&] { ref::amax(x); });
      report("cast_to_fp8+amax", "forward", shape, kBf16 * mk + mk,
             [&] { fused::cast_to_fp8(x, scale, at::kFloat8_e4m3fn, amax_slot); },
             [&] {
               ref::cast_to_fp8(x, scale, at::kFloat8_e4m3fn);
               ref::amax(x);
             });
      report("rowwise_cast_to_fp8", "forward", shape, kBf16 * mk + mk + kF32 * M,
             [&] { fused::rowwise_cast_to_fp8(x, at::kFloat8_e4m3fn); },
             [&] { ref::rowwise_cast_to_fp8(x, at::kFloat8_e4m3fn); });
      for (const ref::MxExponent rule : {ref::MxExponent::floor, ref::MxExponent::rceil})
        report(std::string("mx_cast_fp8 ") + ref::name(rule), "forward", shape, kBf16 * mk + mk + mk / 32,
               [&] { fused::mx_block_cast_to_fp8(x, rule); }, [&] { ref::mx_block_cast_to_fp8(x, rule); });
    }

    std::printf("\n%-22s %-8s %-18s %9s %9s %7s %9s %7s\n", "kernel", "pass", "shape", "fused ms", "ATen ms",
                "speedup", "GB/s", "of copy");
    for (const Row& r : g_rows)
      std::printf("%-22s %-8s %-18s %9.3f %9.3f %6.2fx %9.0f %6.0f%%\n", r.kernel.c_str(), r.pass.c_str(),
                  r.shape.c_str(), r.fused_ms, r.aten_ms, r.aten_ms / r.fused_ms, gbps(r.bytes, r.fused_ms),
                  100 * gbps(r.bytes, r.fused_ms) / g_copy_gbps);
    std::printf("copy (1 GiB, device to device): %.0f GB/s\n", g_copy_gbps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flowtrain_kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
