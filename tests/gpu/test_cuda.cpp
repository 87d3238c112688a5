// The CUDA paths against the CPU reference. Skipped (with the reason) where no GPU is present.
#include "cli_runner.h"
#include "models/autocast_region.h"
#include "models/dit/dit.h"
#include "parallel/activation_checkpoint.h"
#include "test_util.h"
#include "data/image_dataset.h"
#include "data/loader.h"
#include "trainer/builders.h"
#include "trainer/trainer.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

using namespace flowtrain::models;

#define REQUIRE_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine (gpu tests run on the GPU machine)"

namespace {
DiTOptions options() {
  DiTOptions o = dit_size("S");
  o.input_size = 16;
  o.patch = 2;
  o.in_channels = 4;
  o.num_classes = 10;
  return o;
}
double rel_error(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).norm() / b.to(at::kDouble).norm()).item<double>();
}
}  // namespace

TEST(Cuda, DiTForwardMatchesCpuInFp32AndBf16Autocast) {
  REQUIRE_CUDA();
  at::globalContext().setAllowTF32CuBLAS(false);
  at::manual_seed(0);
  DiT model(options());
  // give the zero-initialised output layers weights so the comparison is not 0 == 0
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) if (p.requires_grad()) p.normal_(0, 0.02);
  at::Tensor x = at::randn({4, 4, 16, 16}), t = at::rand({4}), y = at::randint(0, 10, {4});
  at::Tensor ref = model->forward(x, t, y);
  model->to(at::kCUDA);
  at::Tensor out = model->forward(x.cuda(), t.cuda(), y.cuda()).cpu();
  // fp32 on both sides, different summation orders: relative error ~1e-6
  EXPECT_LT(rel_error(out, ref), 1e-4);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::Tensor bf16 = model->forward(x.cuda(), t.cuda(), y.cuda()).to(at::kFloat).cpu();
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  // bf16 has an 8-bit mantissa (2^-8 ≈ 0.4% per rounding); through 12 blocks the output error is
  // a few percent at most
  EXPECT_LT(rel_error(bf16, ref), 5e-2);
}

TEST(Cuda, TrainsTheTinyConfigInBf16) {
  REQUIRE_CUDA();
  const std::string run = flowtrain::test::scratch_dir("run");
  auto r = flowtrain::test::train_tiny(run, {"run.device=cuda", "train.precision=bf16", "train.steps=50"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = flowtrain::test::read_metrics(run);
  ASSERT_EQ(rows.size(), 50u);
  EXPECT_LT(rows.back()["loss"].get<double>(), 0.8 * rows.front()["loss"].get<double>());
}

TEST(Cuda, ActivationCheckpointingUnderBf16AutocastGivesTheStoredGradients) {
  // On the GPU the recompute must replay CUDA autocast (and the CUDA generator): the block
  // gradients then equal those of the run that stores activations.
  REQUIRE_CUDA();
  const at::Tensor x = at::randn({4, 4, 16, 16}).cuda(), t = at::rand({4}).cuda(),
                   y = at::randint(0, 10, {4}).cuda();
  auto block_grads = [&](bool checkpoint) {
    at::manual_seed(0);
    DiT model(options());
    {
      at::NoGradGuard no_grad;
      for (auto& p : model->parameters()) if (p.requires_grad()) p.normal_(0, 0.02);
    }
    model->to(at::kCUDA);
    if (checkpoint)
      model->unit_runner = [](int64_t, const UnitCall& call, const Tensors& inputs) {
        return flowtrain::parallel::checkpointed_call(call, inputs);
      };
    at::Tensor loss;
    {
      AutocastRegion bf16(true, at::kCUDA);
      loss = model->forward(x, t, y).to(at::kFloat).pow(2).mean();
    }
    loss.backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters())
      if (item.key().rfind("blocks.", 0) == 0 && item.value().grad().defined())
        grads[item.key()] = item.value().grad().cpu();
    return grads;
  };
  auto want = block_grads(false), got = block_grads(true);
  ASSERT_EQ(want.size(), got.size());
  // The same bf16 kernels on the same inputs: equal up to non-deterministic reductions (atomics
  // in some CUDA backward kernels), far below the ~1e-2 a recompute in fp32 would differ by.
  for (const auto& [name, g] : want) EXPECT_LT(rel_error(got.at(name), g), 1e-3) << name;
}

TEST(Cuda, StepDrawsOnTheDeviceAreReproducibleAndDifferPerSlice) {
  REQUIRE_CUDA();
  flowtrain::trainer::Config c;
  c.run.seed = 5;
  const auto ts = flowtrain::trainer::timestep_sampler(c);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  at::Tensor x0 = at::zeros({64, 4, 16, 16}, cuda);
  const Conditioning cond{{"labels", at::zeros({64}, cuda.dtype(at::kLong))}};
  DiT model(options());
  const ConditioningDropout dropout = model->conditioning_dropout();
  auto a = flowtrain::trainer::draw_step_inputs(c, ts, dropout, x0, cond, /*step=*/3, /*first_row=*/0);
  auto b = flowtrain::trainer::draw_step_inputs(c, ts, dropout, x0, cond, 3, 0);
  auto other = flowtrain::trainer::draw_step_inputs(c, ts, dropout, x0, cond, 3, 64);  // the next rank's slice
  const at::Tensor& la = a.cond.at("labels");
  EXPECT_TRUE(a.noise.is_cuda() && a.t.is_cuda() && la.is_cuda());
  EXPECT_TRUE(a.noise.equal(b.noise) && a.t.equal(b.t) && la.equal(b.cond.at("labels"))) << "same seed, same draw";
  EXPECT_FALSE(a.noise.equal(other.noise));
  // N(0, 1) noise over 65,536 values: mean within 0.02 (≈ 5 standard errors) and std within 2%.
  EXPECT_LT(std::abs(a.noise.mean().item<double>()), 0.02);
  EXPECT_NEAR(a.noise.std().item<double>(), 1.0, 0.02);
  EXPECT_GT(a.t.min().item<double>(), 0.0);
  EXPECT_LT(a.t.max().item<double>(), 1.0);
}

TEST(Cuda, Tf32MatmulPrecisionFollowsTheConfig) {
  REQUIRE_CUDA();
  flowtrain::trainer::TrainConfig train;
  train.tf32 = true;
  flowtrain::trainer::configure_cuda(c10::Device(c10::kCUDA, 0), train);
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGH);
  train.tf32 = false;
  flowtrain::trainer::configure_cuda(c10::Device(c10::kCUDA, 0), train);
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGHEST);
}

TEST(Cuda, LoaderPinsBatchesForAsynchronousCopies) {
  REQUIRE_CUDA();
  auto dataset = std::make_shared<flowtrain::data::ImageDataset>(
      flowtrain::data::make_synthetic_dataset(256, 4, 16, 10, /*seed=*/1));
  flowtrain::data::LoaderOptions o;
  o.global_batch = 32;
  o.workers = 1;
  o.pin_memory = true;
  flowtrain::data::Loader loader(dataset, o);
  auto batch = loader.next();
  EXPECT_TRUE(batch.images.is_pinned());
  EXPECT_TRUE(batch.labels.is_pinned());
  at::Tensor on_gpu = batch.images.to(at::kCUDA, /*non_blocking=*/true);
  EXPECT_TRUE(on_gpu.cpu().equal(batch.images));
}
