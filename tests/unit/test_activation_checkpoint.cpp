// Activation checkpointing: a recomputed block gives the gradients the stored block gives, and a
// block that draws random numbers draws the same ones when it is recomputed.
#include "models/dit/dit.h"
#include "parallel/activation_checkpoint.h"
#include "test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

using namespace flowtrain;

namespace {

models::DiT make_model() { return test::perturbed_small_dit(/*depth=*/3, /*seed=*/1); }

std::map<std::string, at::Tensor> gradients_of(models::DiT& model, const at::Tensor& x, const at::Tensor& t,
                                               const at::Tensor& y, double* loss) {
  at::Tensor l = model->forward(x, t, y).pow(2).mean();
  l.backward();
  *loss = l.item<double>();
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model->named_parameters())
    if (item.value().grad().defined()) grads[item.key()] = item.value().grad().clone();
  return grads;
}

}  // namespace

TEST(ActivationCheckpoint, RecomputedBlocksGiveTheStoredBlocksGradients) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({4, 4, 8, 8}), t = at::rand({4}), y = at::randint(0, 10, {4});
  models::DiT plain = make_model(), recomputed = make_model();
  int64_t checkpointed = 0;
  recomputed->unit_runner = [&](int64_t i, const models::UnitCall& call, const models::Tensors& inputs) {
    if (!parallel::checkpoint_block("full", 2, i)) return call(inputs);  // blocks 0 and 2
    ++checkpointed;
    return parallel::checkpointed_call(call, inputs);
  };
  double loss_plain = 0, loss_recomputed = 0;
  auto want = gradients_of(plain, x, t, y, &loss_plain);
  auto got = gradients_of(recomputed, x, t, y, &loss_recomputed);
  EXPECT_EQ(checkpointed, 2);
  EXPECT_EQ(loss_plain, loss_recomputed);  // the forward is the same computation
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, g] : want) {
    // Block parameters get the same ops in the same order (bit-identical in practice); the
    // conditioning path's gradient (embedders) sums the blocks' contributions, which the
    // recompute hands back to the outer graph one block at a time: fp32 summation order only.
    EXPECT_TRUE(at::allclose(got.at(name), g, /*rtol=*/1e-5, /*atol=*/1e-8))
        << name << ": max diff " << (got.at(name) - g).abs().max().item<double>();
  }
}

TEST(ActivationCheckpoint, TheRecomputeRunsUnderTheFirstForwardsAutocast) {
  // bf16 training: forward under CPU autocast, backward after the autocast region has closed
  // (as the trainer does). The recompute must run in bf16 again, or the gradients would be
  // those of the fp32 function.
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 4, 8, 8}), t = at::rand({4}), y = at::randint(0, 10, {4});
  auto gradients = [&](bool checkpoint) {
    models::DiT model = make_model();
    if (checkpoint)
      model->unit_runner = [](int64_t, const models::UnitCall& call, const models::Tensors& inputs) {
        return parallel::checkpointed_call(call, inputs);
      };
    at::Tensor loss;
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::increment_nesting();
    loss = model->forward(x, t, y).to(at::kFloat).pow(2).mean();
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    loss.backward();
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters())
      if (item.value().grad().defined()) grads[item.key()] = item.value().grad().clone();
    return grads;
  };
  auto want = gradients(false), got = gradients(true);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, g] : want) {
    if (name.rfind("blocks.", 0) != 0) continue;  // the embedders sum bf16 block contributions in another order
    // The same bf16 ops in the same order; a recompute in fp32 differs by ~1e-2 relative.
    EXPECT_TRUE(at::allclose(got.at(name), g, /*rtol=*/1e-5, /*atol=*/1e-7))
        << name << ": max diff " << (got.at(name) - g).abs().max().item<double>();
  }
}

TEST(ActivationCheckpoint, RandomDrawsAreReplayedInTheRecompute) {
  // A dropout-like block: its mask comes from the global CPU generator.
  auto block = [](const models::Tensors& in) {
    return models::Tensors{in[0] * at::bernoulli(at::full_like(in[0], 0.5)) * 2 + in[1]};
  };
  const at::Tensor x0 = at::randn({3, 5}), c0 = at::randn({3, 5});
  auto run = [&](bool checkpoint, at::Tensor* next_draw) {
    at::manual_seed(9);
    at::Tensor x = x0.clone().requires_grad_(), c = c0.clone().requires_grad_();
    at::Tensor out = (checkpoint ? parallel::checkpointed_call(block, {x, c}) : block({x, c}))[0];
    (out * out).sum().backward();
    *next_draw = at::rand({4});  // the generator continues where the forward left it
    return x.grad();
  };
  at::Tensor next_plain, next_checkpointed;
  const at::Tensor grad_plain = run(false, &next_plain), grad_checkpointed = run(true, &next_checkpointed);
  // A different mask in the recompute would zero other elements: the gradients would differ.
  EXPECT_TRUE(at::equal(grad_plain, grad_checkpointed));
  EXPECT_TRUE(at::equal(next_plain, next_checkpointed));
}

TEST(ActivationCheckpoint, BlockSelection) {
  EXPECT_FALSE(parallel::checkpoint_block("none", 1, 0));
  EXPECT_TRUE(parallel::checkpoint_block("full", 1, 3));
  EXPECT_TRUE(parallel::checkpoint_block("full", 3, 6));
  EXPECT_FALSE(parallel::checkpoint_block("full", 3, 7));
}
