// models/vae/vae.h: the trained autoencoder is FLUX.1's autoencoder (the same key names and
// shapes, so an exported checkpoint is an ae.safetensors) with the VAE objective computed as its
// header writes it.
#include "models/autoencoder/autoencoder.h"
#include "models/vae/vae.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace flowtrain {
namespace {

models::AutoencoderOptions small_options() {
  models::AutoencoderOptions o;
  o.ch = 8;
  o.ch_mult = {1, 2};
  o.num_res_blocks = 1;
  o.z_channels = 4;
  o.norm_groups = 4;
  o.scale_factor = 1.0;
  o.shift_factor = 0.0;
  return o;
}

TEST(Vae, IsFluxsAutoencoderWithTheVaeObjective) {
  torch::manual_seed(3);
  models::VaeModel vae(small_options(), 16);
  models::Autoencoder ae(small_options());
  const trainer::NamedTensors weights = trainer::state_dict(vae);
  const trainer::NamedTensors reference = trainer::state_dict(*ae);
  ASSERT_EQ(weights.size(), reference.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(weights[i].first, reference[i].first);
    EXPECT_EQ(weights[i].second.sizes(), reference[i].second.sizes()) << weights[i].first;
  }
  EXPECT_EQ(models::count_parameters(vae), models::autoencoder_parameter_count(small_options()));
  trainer::load_state_dict(*ae, weights, "the VAE's weights");

  // The loss of the header's formula, through the reference autoencoder's modules and the same ε.
  const at::Tensor x = at::rand({3, 3, 16, 16}) * 2 - 1;
  const double kl_weight = 0.25;  // large, so a wrong KL term shows
  const at::Tensor eps = at::randn({3, 4, 8, 8});
  const at::Tensor loss = vae.loss(x, eps, kl_weight);
  const models::LatentMoments m = ae->moments(x);
  const at::Tensor x_hat = ae->decoder(m.mean + at::exp(0.5 * m.logvar) * eps);
  const at::Tensor kl = 0.5 * (m.mean.pow(2) + m.logvar.exp() - 1.0 - m.logvar);
  const at::Tensor expected = (x_hat - x).pow(2).mean({1, 2, 3}) + kl_weight * kl.mean({1, 2, 3});
  ASSERT_EQ(loss.sizes(), (at::IntArrayRef{3}));
  // The same fp32 operations in the same order: equal to rounding.
  EXPECT_TRUE(at::allclose(loss, expected, 1e-6, 1e-7)) << loss << expected;
  // Reconstruction: the decoder of the mean, no draw; the KL term gives the loss a gradient.
  EXPECT_TRUE(at::allclose(vae.reconstruct(x), ae->decoder(m.mean), 1e-6, 1e-7));
  loss.mean().backward();
  EXPECT_GT(vae.encoder->conv_out->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_THROW(vae.forward(x, at::zeros({3}), {}), std::logic_error);
}

TEST(Vae, CountsItsFlops) {
  // ch 8, ch_mult 1,2, one block a level, z 4, 16² images; multiply-adds by hand:
  //   encoder conv_in 3->8 3×3 @256: 55,296; level 0 resnet 8->8 @256: 2·576·256 = 294,912;
  //   downsample 8->8 3×3 @64: 36,864; level 1 resnet 8->16 @64: (1,152 + 2,304 + 128)·64 = 229,376;
  //   mid (16 @64): 2 resnets 2·2,304·64·2 = 589,824 + q,k,v,proj 4·256·64 = 65,536 + attention
  //   2·64·64·16 = 131,072; conv_out 16->8 @64: 73,728
  //   decoder conv_in 4->16 @64: 36,864; mid 786,432; level 1: 2 resnets 16->16 @64: 589,824;
  //   upsample 16->16 @256: 589,824; level 0: resnet 16->8 (1,152 + 576 + 128)·256 = 475,136,
  //   resnet 8->8 @256: 294,912; conv_out 8->3 @256: 55,296
  const double macs = 55296 + 294912 + 36864 + 229376 + 589824 + 65536 + 131072 + 73728 + 36864 + 786432 + 589824 +
                      589824 + 475136 + 294912 + 55296;
  EXPECT_DOUBLE_EQ(models::vae_train_flops_per_sample(small_options(), 16), 3 * 2 * macs);
}

}  // namespace
}  // namespace flowtrain
