// The fused CPU kernels (models/kernels/cpu_fused.h) through the fused-op table
// (tests/fused_op_table.h): every case of every op with a CPU kernel, forward and backward,
// against the op's ATen composition in float64. tests/gpu/test_cuda_fused.cpp runs the same
// table on the CUDA kernels.
#include "fused_op_table.h"

#include "models/kernels/cpu_fused.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace cpu_fused = flowtrain::models::cpu_fused;

class CpuFusedOp : public ::testing::TestWithParam<std::string> {};
TEST_P(CpuFusedOp, MatchesTheFloat64Composition) { flowtrain::test::check_op_on_backend(GetParam(), "cpu"); }
INSTANTIATE_TEST_SUITE_P(Table, CpuFusedOp, ::testing::ValuesIn(flowtrain::test::ops_of_backend("cpu")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Outside their domain the kernels decline (and layers.h takes ATen's path); the checks say so.
TEST(CpuFused, KernelsDeclineWhatTheyDoNotTake) {
  EXPECT_FALSE(cpu_fused::supports_qkv_attention(at::randn({1, cpu_fused::kQkvAttentionMaxTokens + 1, 48}), 2));
  EXPECT_FALSE(cpu_fused::supports_qkv_attention(at::randn({1, 9, 36}), 2));  // Dh = 6
  EXPECT_FALSE(cpu_fused::supports_qkv_attention(at::randn({1, 9, 48}, at::kDouble), 2));
  EXPECT_FALSE(cpu_fused::supports_gelu_tanh(at::zeros({1}, at::kDouble)));
  const at::Tensor x = at::randn({2, 3, 8}), v = at::randn({2, 8});
  EXPECT_TRUE(cpu_fused::supports(x, {&v, &v}));
  EXPECT_FALSE(cpu_fused::supports(x.to(at::kDouble), {&v, &v}));
  const at::Tensor wrong_width = at::randn({2, 4});
  EXPECT_FALSE(cpu_fused::supports(x, {&v, &wrong_width}));
  const at::Tensor other = at::randn({2, 4, 8});
  EXPECT_FALSE(cpu_fused::supports(x, {&v}, &other));
}

namespace {
// The failure messages `check` reports, intercepted (the test itself does not fail by them).
std::vector<std::string> failures_of(const std::function<void()>& check) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check();
  }
  std::vector<std::string> messages;
  for (int i = 0; i < results.size(); ++i) messages.push_back(results.GetTestPartResult(i).message());
  return messages;
}
int64_t count_containing(const std::vector<std::string>& messages, const std::string& text) {
  return std::count_if(messages.begin(), messages.end(),
                       [&](const std::string& m) { return m.find(text) != std::string::npos; });
}
}  // namespace

// The table's check fails a kernel that is off by 1e-4 (10× the fp32 bar) in its output, or in
// one gradient, in every case; and a kernel that declines a case of its own table: it cannot pass
// vacuously.
TEST(CpuFused, TheTableFailsAWrongKernel) {
  using flowtrain::test::FusedOp;
  using flowtrain::test::Params;
  const auto& ops = flowtrain::test::fused_ops();
  const auto adaln = std::find_if(ops.begin(), ops.end(), [](const FusedOp& op) { return op.name == "adaln_modulate"; });
  ASSERT_NE(adaln, ops.end());
  const auto cases = static_cast<int64_t>(adaln->cases.size());
  const flowtrain::test::OpFn right = adaln->kernels.at("cpu").run;

  FusedOp off_in_value = *adaln;
  off_in_value.kernels["cpu"].run = [right](const std::vector<at::Tensor>& in, const Params& p) {
    return right(in, p) * (1 + 1e-4);
  };
  auto failures = failures_of([&] { flowtrain::test::check_op_on_backend(off_in_value, "cpu"); });
  EXPECT_EQ(count_containing(failures, "output: relative error"), cases);

  FusedOp off_in_grad = *adaln;
  off_in_grad.kernels["cpu"].run = [right](const std::vector<at::Tensor>& in, const Params& p) {
    // the same value; ∂x gains 1e-4 × the incoming gradient
    return right(in, p) + 1e-4 * (in[0] - in[0].detach());
  };
  failures = failures_of([&] { flowtrain::test::check_op_on_backend(off_in_grad, "cpu"); });
  EXPECT_EQ(count_containing(failures, "grad of input 0: relative error"), cases);
  EXPECT_EQ(count_containing(failures, "output"), 0);

  FusedOp declines = *adaln;
  declines.kernels["cpu"].supports = [](const std::vector<at::Tensor>&, const Params&) { return false; };
  failures = failures_of([&] { flowtrain::test::check_op_on_backend(declines, "cpu"); });
  EXPECT_EQ(count_containing(failures, "declines a case"), 1);
}
