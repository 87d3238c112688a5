#include "models/vae/vae.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace flowtrain::models {

namespace {

// Multiply-adds of the layers, at a feature map of `cells` positions.
double conv_macs(int64_t in, int64_t out, int64_t kernel, double cells) { return double(in * out * kernel * kernel) * cells; }
double resnet_macs(int64_t in, int64_t out, double cells) {
  return conv_macs(in, out, 3, cells) + conv_macs(out, out, 3, cells) + (in != out ? conv_macs(in, out, 1, cells) : 0);
}
double mid_macs(int64_t c, double cells) {
  return 2 * resnet_macs(c, c, cells) + 4 * conv_macs(c, c, 1, cells) + 2 * cells * cells * double(c);
}
int64_t width(const AutoencoderOptions& o, int64_t level) { return o.ch * o.ch_mult.at(level); }

}  // namespace

double vae_train_flops_per_sample(const AutoencoderOptions& o, int64_t image_size) {
  const int64_t L = o.levels();
  auto cells = [&](int64_t level) { return double((image_size >> level) * (image_size >> level)); };
  double macs = conv_macs(o.in_channels, o.ch, 3, cells(0));  // encoder
  for (int64_t level = 0; level < L; ++level) {
    int64_t in = level == 0 ? o.ch : width(o, level - 1);
    for (int64_t b = 0; b < o.num_res_blocks; ++b, in = width(o, level)) macs += resnet_macs(in, width(o, level), cells(level));
    if (level != L - 1) macs += conv_macs(width(o, level), width(o, level), 3, cells(level + 1));  // stride 2
  }
  const int64_t last = width(o, L - 1);
  macs += mid_macs(last, cells(L - 1)) + conv_macs(last, 2 * o.z_channels, 3, cells(L - 1));
  macs += conv_macs(o.z_channels, last, 3, cells(L - 1)) + mid_macs(last, cells(L - 1));  // decoder
  int64_t in = last;
  for (int64_t level = L - 1; level >= 0; --level) {
    for (int64_t b = 0; b <= o.num_res_blocks; ++b, in = width(o, level)) macs += resnet_macs(in, width(o, level), cells(level));
    if (level != 0) macs += conv_macs(width(o, level), width(o, level), 3, cells(level - 1));  // after nearest ×2
  }
  macs += conv_macs(o.ch, o.out_channels, 3, cells(0));
  return 3.0 * 2.0 * macs;
}

VaeModel::VaeModel(AutoencoderOptions o, int64_t side) : options(std::move(o)), image_size(side) {
  encoder = register_module("encoder", AeEncoder(options));
  decoder = register_module("decoder", AeDecoder(options));
}

LatentMoments VaeModel::moments(const at::Tensor& x) {
  const Tensors out = unit_runner ? unit_runner(0, [this](const Tensors& in) { return Tensors{encoder(in[0])}; }, {x})
                                  : Tensors{encoder(x)};
  const std::vector<at::Tensor> halves = out[0].chunk(2, 1);
  return {halves[0], halves[1].clamp(-30.0, 20.0)};
}

at::Tensor VaeModel::decode(const at::Tensor& z) {
  if (!unit_runner) return decoder(z);
  return unit_runner(1, [this](const Tensors& in) { return Tensors{decoder(in[0])}; }, {z})[0];
}

at::Tensor VaeModel::loss(const at::Tensor& x, const at::Tensor& eps, double kl_weight) {
  const LatentMoments m = moments(x);
  TORCH_CHECK(eps.sizes() == m.mean.sizes(), "VaeModel::loss: eps of shape ", eps.sizes(), ", latents ", m.mean.sizes());
  const at::Tensor z = m.mean + at::exp(0.5 * m.logvar) * eps.to(m.mean.device(), m.mean.scalar_type());
  const at::Tensor reconstruction = decode(z);
  const at::Tensor squared = (reconstruction.to(at::kFloat) - x.to(at::kFloat)).pow(2).flatten(1).mean(1);
  const at::Tensor kl =
      (0.5 * (m.mean.to(at::kFloat).pow(2) + m.logvar.to(at::kFloat).exp() - 1.0 - m.logvar.to(at::kFloat))).flatten(1).mean(1);
  return squared + kl_weight * kl;
}

at::Tensor VaeModel::reconstruct(const at::Tensor& x) { return decode(moments(x).mean); }

at::Tensor VaeModel::forward(const at::Tensor&, const at::Tensor&, const Conditioning&) {
  throw std::logic_error("an autoencoder has no velocity: it is trained by its own objective (models/vae/vae.h)");
}

std::vector<int64_t> VaeModel::sample_shape() const { return {options.in_channels, image_size, image_size}; }

int64_t VaeModel::tokens_per_sample() const {
  const int64_t side = image_size / options.downscale();
  return side * side;
}

std::string VaeModel::token_layout() const {
  return fmt::format("latent cells (model.image_size {} / {})²", image_size, options.downscale());
}

double VaeModel::train_flops_per_sample() const { return vae_train_flops_per_sample(options, image_size); }

std::string VaeModel::describe() const {
  return fmt::format("autoencoder ch {}, ch_mult {}, {} res blocks, z {} ({}× down: {}² images -> {}² × {} latents)",
                     options.ch, fmt::join(options.ch_mult, ","), options.num_res_blocks, options.z_channels,
                     options.downscale(), image_size, image_size / options.downscale(), options.z_channels);
}

void VaeModel::set_attention(const AttentionFn&) {
  throw std::invalid_argument("context parallelism does not apply to the autoencoder (parallel.cp must be 1)");
}

}  // namespace flowtrain::models
