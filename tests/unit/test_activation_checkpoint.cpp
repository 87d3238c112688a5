// Activation checkpointing: a recomputed block — or only its attention or its MLP (selective) —
// gives the gradients the stored one gives, and a block that draws random numbers draws the
// same ones when it is recomputed.
#include "models/dit/dit.h"
#include "models/flux/flux.h"
#include "parallel/activation_checkpoint.h"
#include "test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <optional>

using namespace flowtrain;

namespace {

models::DiT make_model() { return test::perturbed_small_dit(/*depth=*/3, /*seed=*/1); }

std::map<std::string, at::Tensor> parameter_gradients(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model.named_parameters())
    if (item.value().grad().defined()) grads[item.key()] = item.value().grad().clone();
  return grads;
}

std::map<std::string, at::Tensor> gradients_of(models::DiT& model, const at::Tensor& x, const at::Tensor& t,
                                               const at::Tensor& y, double* loss) {
  at::Tensor l = model->forward(x, t, y).pow(2).mean();
  l.backward();
  *loss = l.item<double>();
  return parameter_gradients(*model);
}

}  // namespace

TEST(ActivationCheckpoint, RecomputedBlocksGiveTheStoredBlocksGradients) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({4, 4, 8, 8}), t = at::rand({4}), y = at::randint(0, 10, {4});
  models::DiT plain = make_model(), recomputed = make_model();
  int64_t checkpointed = 0;
  recomputed->unit_runner = [&](int64_t i, const models::UnitCall& call, const models::Tensors& inputs) {
    if (!parallel::checkpoint_block(parallel::RecomputePolicy::full, 2, i)) return call(inputs);  // blocks 0 and 2
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
    return parameter_gradients(*model);
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

namespace {

// Installs selective checkpointing of `part` on every block, counting the recomputed sublayers.
void checkpoint_sublayers(models::DiffusionModel& model, models::Sublayer part, int64_t* count) {
  model.sublayer_runner = [part, count](int64_t i, models::Sublayer p, const models::UnitCall& call,
                                        const models::Tensors& inputs) {
    if (!parallel::checkpoint_sublayer(part == models::Sublayer::Attention ? parallel::RecomputePolicy::attention
                                                                       : parallel::RecomputePolicy::mlp,
                                       1, i, p))
      return call(inputs);
    ++*count;
    return parallel::checkpointed_call(call, inputs);
  };
}

void expect_same_gradients(const std::map<std::string, at::Tensor>& want,
                           const std::map<std::string, at::Tensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, g] : want) {
    // The recompute repeats the same fp32 ops; what differs is the order in which the outer
    // graph sums the contributions handed back by each recomputed piece (the conditioning
    // vector and the residual stream collect several): summation order only, as above.
    EXPECT_TRUE(at::allclose(got.at(name), g, /*rtol=*/1e-5, /*atol=*/1e-8))
        << name << ": max diff " << (got.at(name) - g).abs().max().item<double>();
  }
}

}  // namespace

TEST(ActivationCheckpoint, SelectiveRecomputeOfAttentionOrMlpGivesTheStoredGradientsInDiT) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({4, 4, 8, 8}), t = at::rand({4}), y = at::randint(0, 10, {4});
  double loss = 0;
  models::DiT plain = make_model();
  const auto want = gradients_of(plain, x, t, y, &loss);
  for (const auto part : {models::Sublayer::Attention, models::Sublayer::Mlp}) {
    models::DiT model = make_model();
    int64_t recomputed = 0;
    checkpoint_sublayers(*model, part, &recomputed);
    double selective_loss = 0;
    expect_same_gradients(want, gradients_of(model, x, t, y, &selective_loss));
    EXPECT_EQ(selective_loss, loss);
    EXPECT_EQ(recomputed, 3);  // one sublayer in each of the 3 blocks
  }
}

TEST(ActivationCheckpoint, SelectiveRecomputeOfAttentionOrMlpGivesTheStoredGradientsInFlux) {
  // 1 double block (a joint attention, two MLPs) and 2 single blocks (attention; GELU + linear2).
  models::FluxOptions o = models::flux_size("flux-tiny");
  o.in_channels = 4;
  o.patch = 2;
  o.depth = 1;
  o.depth_single = 2;
  o.input_size = 8;
  o.text_len = 5;
  at::manual_seed(8);
  const int64_t B = 2;
  const at::Tensor img = at::randn({B, 16, o.token_dim()}), txt = at::randn({B, o.text_len, o.context_dim});
  const at::Tensor img_ids = models::image_ids(B, 4, 4, at::TensorOptions()), txt_ids = at::zeros({B, o.text_len, 3});
  const at::Tensor t = at::rand({B}), y = at::randn({B, o.vec_dim});
  auto gradients = [&](std::optional<models::Sublayer> part, int64_t* recomputed) {
    at::manual_seed(1);
    models::Flux model(o);
    {
      at::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.normal_(0, 0.1);  // modulations and gates non-zero
    }
    if (part) checkpoint_sublayers(*model, *part, recomputed);
    model->forward_tokens(img, img_ids, txt, txt_ids, t, y, at::Tensor()).pow(2).mean().backward();
    return parameter_gradients(*model);
  };
  int64_t none = 0, attention = 0, mlp = 0;
  const auto want = gradients(std::nullopt, &none);
  expect_same_gradients(want, gradients(models::Sublayer::Attention, &attention));
  expect_same_gradients(want, gradients(models::Sublayer::Mlp, &mlp));
  EXPECT_EQ(attention, 3);  // the double block's joint attention, each single block's
  EXPECT_EQ(mlp, 4);        // the double block's image and text MLPs, each single block's
}

TEST(ActivationCheckpoint, BlockSelection) {
  EXPECT_FALSE(parallel::checkpoint_block(parallel::RecomputePolicy::none, 1, 0));
  EXPECT_TRUE(parallel::checkpoint_block(parallel::RecomputePolicy::full, 1, 3));
  EXPECT_TRUE(parallel::checkpoint_block(parallel::RecomputePolicy::full, 3, 6));
  EXPECT_FALSE(parallel::checkpoint_block(parallel::RecomputePolicy::full, 3, 7));
  EXPECT_FALSE(parallel::checkpoint_block(parallel::RecomputePolicy::attention, 1, 0));  // selective: no whole block
  using models::Sublayer;
  EXPECT_TRUE(parallel::checkpoint_sublayer(parallel::RecomputePolicy::attention, 1, 2, Sublayer::Attention));
  EXPECT_FALSE(parallel::checkpoint_sublayer(parallel::RecomputePolicy::attention, 1, 2, Sublayer::Mlp));
  EXPECT_TRUE(parallel::checkpoint_sublayer(parallel::RecomputePolicy::mlp, 2, 4, Sublayer::Mlp));
  EXPECT_FALSE(parallel::checkpoint_sublayer(parallel::RecomputePolicy::mlp, 2, 5, Sublayer::Mlp));
  EXPECT_FALSE(parallel::checkpoint_sublayer(parallel::RecomputePolicy::full, 1, 0, Sublayer::Attention));  // full: the block runner's job
}
