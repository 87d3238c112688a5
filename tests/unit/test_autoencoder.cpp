// The FLUX autoencoder against the reference's own code (black-forest-labs/flux
// src/flux/modules/autoencoder.py): golden files written by tests/reference/make_golden.py.
#include "models/autoencoder/autoencoder.h"

#include "data/safetensors.h"
#include "reference_golden.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace flowtrain {
namespace {

using models::Autoencoder;
using models::AutoencoderOptions;

// The tiny reference model's options, as make_golden.py built it.
AutoencoderOptions tiny_ae_options() {
  AutoencoderOptions o;
  o.ch = 8;
  o.ch_mult = {1, 2};
  o.num_res_blocks = 1;
  o.z_channels = 4;
  o.norm_groups = 4;
  return o;
}

TEST(Autoencoder, FluxsHasTheOfficialKeysShapesAndOrder) {
  // ae_flux_keys.txt: the reference's state_dict of FLUX.1's autoencoder (built on the meta
  // device), one "name d0,d1,…" a line; ae.safetensors holds exactly these.
  const std::vector<std::string> expected = test::golden_lines("ae_flux_keys.txt");
  int64_t expected_numel = 0;
  for (const std::string& line : expected) {
    std::stringstream dims(line.substr(line.find(' ') + 1));
    int64_t numel = 1;
    for (std::string d; std::getline(dims, d, ',');) numel *= std::stoll(d);
    expected_numel += numel;
  }
  const Autoencoder ae(models::flux_autoencoder_options());
  EXPECT_EQ(test::key_shape_lines(*ae), expected);
  EXPECT_EQ(models::autoencoder_parameter_count(models::flux_autoencoder_options()), expected_numel);
  EXPECT_EQ(expected_numel, 83819683);  // FLUX.1's autoencoder: 83.8M parameters
}

TEST(Autoencoder, EncodesAndDecodesAsTheReference) {
  Autoencoder ae(tiny_ae_options());
  trainer::load_weights_file(*ae, test::golden_path("ae_tiny.safetensors"), "");  // strict: every key, every shape
  EXPECT_EQ(models::autoencoder_parameter_count(tiny_ae_options()), 43619);  // the reference's count
  const data::SafetensorsReader io(test::golden_path("ae_tiny_io.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor x = io.get("x");  // [2, 3, 16, 12]
  const models::LatentMoments m = ae->moments(x);
  const at::Tensor z = ae->encode(x);
  const at::Tensor decoded = ae->decode(io.get("z"));
  // Tolerance: fp32 on both sides with the same ATen convolution, GroupNorm and attention
  // kernels, which may still sum in another order (threads, blocking): ~1e-7 relative per op
  // over ~20 ops. A wrong layer, pad side, resampling or key mapping is O(1) off.
  constexpr double kTolerance = 1e-5;
  EXPECT_LT(test::relative_max_error(at::cat({m.mean, m.logvar}, 1), io.get("moments")), kTolerance);
  EXPECT_LT(test::relative_max_error(z, io.get("z")), kTolerance);
  EXPECT_LT(test::relative_max_error(decoded, io.get("decoded")), kTolerance);
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{2, 4, 8, 6}));  // 2× down per level past the first
  EXPECT_EQ(decoded.sizes(), x.sizes());
}

TEST(Autoencoder, AFileOfAnotherShapeIsOneErrorNamingTheKeys) {
  AutoencoderOptions wider = tiny_ae_options();
  wider.z_channels = 8;
  Autoencoder ae(wider);
  try {
    trainer::load_weights_file(*ae, test::golden_path("ae_tiny.safetensors"), "");
    FAIL() << "a file of 4 latent channels loaded into a model of 8";
  } catch (const trainer::CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("encoder.conv_out.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("decoder.conv_in.weight"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace flowtrain
