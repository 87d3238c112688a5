// One table of the fused ops and the backends that implement them, run the way ggml's
// test-backend-ops runs its ops: every (op, case, dtype) on every backend present, forward and
// backward, against the op's ATen composition evaluated in float64 on the CPU from the same
// (dtype-rounded) inputs. A new kernel is a row here (its cases, its reference, its backends'
// entry points), not a new test file per backend.
//
// The fp8 casts are not in the table: they are bit-exact against models/kernels/
// fp8_cast_reference.h, tested in tests/gpu/test_cuda_fused.cpp with the inputs that matter to
// them (outliers, zero rows, NaN signs).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace flowtrain::test {

// One input of a case: a leaf tensor made on the CPU in fp32.
struct OpInput {
  at::Tensor value;
  bool differentiable = true;  // gets a gradient that is compared
  bool follows_dtype = true;   // cast to the run's dtype (false: stays fp32, e.g. RoPE angles)
};

// An op's integer arguments that are not tensors (qkv_attention's head count); most have none.
using Params = std::vector<int64_t>;
// The op's inputs are the case's leaves; the op itself makes the views it needs of them
// (chunks of an adaLN output, q out of a qkv split), as the model passes them to the kernel.
using OpFn = std::function<at::Tensor(const std::vector<at::Tensor>& leaves, const Params& params)>;
// Whether a backend's kernel takes these operands (the run fails if a table case is not taken:
// a case the kernel silently declines would test the fallback instead).
using SupportsFn = std::function<bool(const std::vector<at::Tensor>& leaves, const Params& params)>;

struct OpCase {
  OpCase(std::string label, std::function<std::vector<OpInput>()> make, Params params = {})
      : label(std::move(label)), make(std::move(make)), params(std::move(params)) {}
  std::string label;  // shown in failures: the shape and variant
  std::function<std::vector<OpInput>()> make;  // seeded inside, so each case is reproducible
  Params params;
};

struct OpKernel {
  OpKernel() = default;
  OpKernel(SupportsFn supports, OpFn run, std::function<bool()> available = {})
      : supports(std::move(supports)), run(std::move(run)), available(std::move(available)) {}
  SupportsFn supports;
  OpFn run;
  // Whether this machine has what the kernel needs (AVX2 + FMA for some CPU kernels); empty =
  // always. Without it the op is skipped on this backend, saying why.
  std::function<bool()> available;
};

struct FusedOp {
  std::string name;
  std::vector<OpCase> cases;
  OpFn reference;                          // the ATen composition (run in float64)
  std::map<std::string, OpKernel> kernels;  // by backend name
};

struct Backend {
  std::string name;  // "cpu", "cuda"
  c10::Device device{c10::kCPU};
  std::vector<at::ScalarType> dtypes;  // the dtypes every kernel of this backend takes
  std::function<bool()> present;       // built in, and the hardware is here
  // Fills the allocator's free blocks of these sizes with NaN bytes before a kernel runs, so an
  // output element a kernel forgets to write shows as NaN (CUDA); may be empty.
  std::function<void(std::initializer_list<int64_t> bytes)> poison;
};

const std::vector<FusedOp>& fused_ops();
const Backend& backend(const std::string& name);
// Names of the table's ops that `backend_name` implements (for test instantiation).
std::vector<std::string> ops_of_backend(const std::string& backend_name);

// Runs every case of op `op_name` in every dtype of the backend, with GoogleTest expectations.
void check_op_on_backend(const std::string& op_name, const std::string& backend_name);
// The same for an op given whole (the table's own test runs deliberately wrong kernels).
void check_op_on_backend(const FusedOp& op, const std::string& backend_name);

// The norm-wise relative error ‖got − want‖ / ‖want‖ that every comparison of the table uses.
// Bars: fp32 1e-5 — the kernels differ from float64 by fp32 rounding (u = 6e-8) of O(1) values
// through D- and N-term sums and rsqrtf (≤ 2 ulp), ~1e-6; bf16 and fp16 1e-2 — every output is
// rounded once to 8 significant bits (≤ 2^-9 relative an element; RmsNorm's normalised value a
// second time, as the reference model does), fp16 to 11 bits, well inside the same bar.
double tolerance(at::ScalarType dtype);

// Fills blocks of the CUDA caching allocator of these sizes with 0xFF bytes (NaN in fp32, bf16,
// fp16 and both fp8 formats) and frees them: outputs of those sizes are then carved from the same
// blocks, so an element a kernel forgets to write shows up as NaN or as a mismatch.
void poison_cuda_blocks(std::initializer_list<int64_t> bytes);

}  // namespace flowtrain::test
