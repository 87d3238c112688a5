// The held-out loss of `flowtrain eval` (trainer/eval/validation_loss.h): the draws are fixed by
// the seed, the batches are weighted by their rows, and the images are prepared as the loader
// prepares them.
#include "test_util.h"
#include "trainer/config/config.h"
#include "trainer/eval/validation_loss.h"
#include "trainer/family.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

using namespace flowtrain;

TEST(ValidationLoss, AZeroVelocityModelScoresTheMeanSquaredNoiseMinusDataOfTheSeededDraws) {
  // A freshly built DiT predicts exactly 0 (its final layer starts at zero), so its loss is
  // mean((ε − x0)²) for the ε the seed gives: computed here in float64 from the same draws.
  trainer::Config c = trainer::load_config(test::source_path("tests/configs/tiny_fashion.yaml"));
  auto model = trainer::build_model(c.model);
  const int64_t n = 300;  // two batches of the 250-row limit: 250 + 50
  at::manual_seed(3);
  const at::Tensor images = at::randint(0, 256, {n, 1, 28, 28}, at::TensorOptions().dtype(at::kByte));
  const models::Conditioning cond{{"labels", at::arange(n, at::kLong) % 10}};
  const double loss = trainer::validation_loss(*model, images, cond, c, c10::Device(c10::kCPU), /*seed=*/7);

  at::Tensor x0 = images.to(at::kDouble) / 127.5 - 1.0;
  const int64_t pad = (c.model.image_size - 28) / 2;
  if (pad > 0) x0 = at::constant_pad_nd(x0, {pad, c.model.image_size - 28 - pad, pad, c.model.image_size - 28 - pad}, -1.0);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor noise = at::randn(x0.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  const double want = (noise - x0).pow(2).mean().item<double>();
  // fp32 arithmetic over 300 × 784 terms in two batch means: relative error ~1e-7; 1e-5 is far
  // below what a wrong draw (another seed: ~1e-2), a dropped batch or an unweighted mean of the
  // two batch means (~1e-3 here) would change.
  EXPECT_NEAR(loss / want, 1.0, 1e-5) << loss << " vs " << want;
  EXPECT_GT(want, 1.0);  // E[ε²] = 1 plus E[x0²]
}
