// The CUDA path of checkpoint staging (trainer/checkpoint/staging.h): copies on a side stream,
// ordered after the step that produced the state and before the update that overwrites it.
#include "trainer/checkpoint/staging.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

using namespace flowtrain::trainer;

TEST(CudaStaging, TheUpdateAfterAStageWaitsForTheCopiesAndTheBuffersHoldTheStagedState) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine (gpu tests run on the GPU machine)";
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  // 256 MiB: a copy long enough that an update racing it would land inside it.
  at::Tensor weights = at::zeros({64, 1024, 1024}, cuda);
  weights.add_(at::arange(64, cuda).view({64, 1, 1}));  // queued on the current stream: the "step"
  CheckpointContents state;
  state.model = {{"w", weights}};
  state.rng = {{"cpu", at::arange(16, at::kByte)}};
  CheckpointStager stager;
  CheckpointContents staged = stager.stage(state);
  ASSERT_TRUE(staged.model[0].second.is_pinned());
  stager.before_state_update();
  weights.mul_(-1);  // the "optimizer step": must not reach the staged copy
  stager.wait();
  const at::Tensor expected = at::arange(64, at::kFloat).view({64, 1, 1}).expand({64, 1024, 1024});
  EXPECT_TRUE(staged.model[0].second.equal(expected)) << "the copy saw the update, or missed the step";
  EXPECT_TRUE(staged.rng[0].second.equal(at::arange(16, at::kByte)));
  // Reused on the next save.
  const void* address = staged.model[0].second.data_ptr();
  EXPECT_EQ(stager.stage(state).model[0].second.data_ptr(), address);
  stager.wait();
}
