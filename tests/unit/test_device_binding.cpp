// Which GPU a rank binds to (trainer/builders.h cuda_device_for_rank): a pure function of the
// launch environment, so the rules are checked here without a GPU.
#include "trainer/builders.h"
#include "trainer/config/config.h"

#include <gtest/gtest.h>

using flowtrain::trainer::ConfigError;
using flowtrain::trainer::cuda_device_for_rank;

TEST(DeviceBinding, EachLocalRankGetsItsOwnGpuWhenTheProcessSeesAllOfThem) {
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(cuda_device_for_rank(r, 8, ""), r);
  EXPECT_EQ(cuda_device_for_rank(-1, 8, ""), 0);  // no launcher: the first GPU
}

TEST(DeviceBinding, ARankThatSeesOneGpuUsesIt) {
  // srun --gpus-per-task=1 / one pod per GPU: CUDA_VISIBLE_DEVICES holds one id per task.
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(cuda_device_for_rank(r, 1, std::to_string(r)), 0);
}

TEST(DeviceBinding, MoreRanksThanVisibleGpusIsAnErrorNamingTheVariable) {
  try {
    cuda_device_for_rank(9, 8, "0,1,2,3,4,5,6,7");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("LOCAL_RANK is 9"), std::string::npos) << m;
    EXPECT_NE(m.find("sees only 8 CUDA devices"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"), std::string::npos) << m;
  }
  EXPECT_THROW(cuda_device_for_rank(2, 2, ""), ConfigError);
  EXPECT_THROW(cuda_device_for_rank(0, 0, ""), ConfigError);
}
