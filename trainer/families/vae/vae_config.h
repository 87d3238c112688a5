// The VAE family's keys of the `model:` section (besides ModelConfig's own): read as
// model.family<VaeConfig>(), declared to the schema by vae_family().
// Of ModelConfig's own keys it reads image_size (the images' side), in_channels (the images'
// channels), hidden (the level-0 width, FLUX's `ch`; 0 = from size) and depth (ResNet blocks per
// level, FLUX's `num_res_blocks`; 0 = from size).
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::trainer::families {

struct VaeConfig {
  std::string ch_mult = "";  // width of level i = hidden · ch_mult[i], e.g. "1,2,4,4"; '' = from size
  int64_t z_channels = 16;   // latent channels
  int64_t norm_groups = 32;  // GroupNorm groups (FLUX: 32)
  double kl_weight = 1e-3;   // weight of the KL term against the mean squared reconstruction error
};

}  // namespace flowtrain::trainer::families
