// The FLUX.1 autoencoder (black-forest-labs/flux src/flux/modules/autoencoder.py): a
// convolutional VAE that maps images in [-1, 1] to latents 8× smaller per side with 16 channels,
// in which FLUX is trained.
//
//   encode  x [B, 3, H, W] ─ conv_in ─ down[i]: num_res_blocks ResnetBlocks (+ Downsample but at
//           the last level) ─ mid: ResnetBlock, AttnBlock, ResnetBlock ─ GroupNorm, swish,
//           conv_out ─▶ moments [B, 2·z, H/8, W/8] = mean ‖ logvar
//           z = scale_factor · (mean − shift_factor)   (or a sample mean + exp(logvar/2)·ε)
//   decode  z / scale_factor + shift_factor ─ conv_in ─ mid ─ up[i] from the last level down:
//           num_res_blocks + 1 ResnetBlocks (+ Upsample but at level 0) ─ GroupNorm, swish,
//           conv_out ─▶ x̂ [B, 3, H, W]
//
//   ResnetBlock  x + conv2(swish(norm2(conv1(swish(norm1(x)))))), x through a 1×1 nin_shortcut
//                when the channels change; GroupNorm(32, eps 1e-6)
//   AttnBlock    x + proj_out(SDPA(q, k, v)) over the h·w positions, one head of all channels,
//                q/k/v 1×1 convs of norm(x)
//   Downsample   zero-pad right and bottom by 1, conv 3×3 stride 2 (asymmetric, as the reference)
//   Upsample     nearest ×2, conv 3×3
//
// Parameter names and shapes are ae.safetensors' (`encoder.down.0.block.0.norm1.weight`,
// `decoder.up.3.upsample.conv.weight`, `encoder.mid.attn_1.q.weight`, …): official weights
// load as they are, and what flowtrain writes loads into the reference code.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <vector>

namespace flowtrain::models {

struct AutoencoderOptions {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t ch = 128;                          // width of level 0
  std::vector<int64_t> ch_mult = {1, 2, 4, 4};  // width of level i = ch · ch_mult[i]
  int64_t num_res_blocks = 2;
  int64_t z_channels = 16;
  double scale_factor = 0.3611;
  double shift_factor = 0.1159;
  // GroupNorm groups: 32 in every FLUX autoencoder; smaller only for models narrower than 32
  // channels (the reference-equality tests).
  int64_t norm_groups = 32;

  int64_t levels() const { return static_cast<int64_t>(ch_mult.size()); }
  int64_t downscale() const { return int64_t{1} << (levels() - 1); }  // 8 for FLUX's
};

// FLUX.1's (dev, schnell, Krea): 3 → 16 channels, 8× down.
AutoencoderOptions flux_autoencoder_options();
// The parameter count from the options, without building (83.8M for FLUX's).
int64_t autoencoder_parameter_count(const AutoencoderOptions& o);

at::Tensor swish(const at::Tensor& x);

struct AeResnetBlockImpl : torch::nn::Module {
  AeResnetBlockImpl(int64_t in_channels, int64_t out_channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Conv2d nin_shortcut{nullptr};  // only when in_channels != out_channels
};
TORCH_MODULE(AeResnetBlock);

struct AeAttnBlockImpl : torch::nn::Module {
  AeAttnBlockImpl(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(AeAttnBlock);

// Keys *.downsample.conv.* / *.upsample.conv.*: the resampler's conv.
struct AeResampleImpl : torch::nn::Module {
  AeResampleImpl(int64_t channels, bool down);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
  bool down;
};
TORCH_MODULE(AeResample);

// One resolution level: `block` (ResnetBlocks) and, between levels, `downsample` or `upsample`.
struct AeLevelImpl : torch::nn::Module {
  torch::nn::ModuleList block{nullptr};
  AeResample resample{nullptr};  // registered as "downsample" or "upsample"; null at the last level
  at::Tensor forward(at::Tensor x);
};
TORCH_MODULE(AeLevel);

// block_1, attn_1, block_2 at the lowest resolution.
struct AeMidImpl : torch::nn::Module {
  AeMidImpl(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  AeResnetBlock block_1{nullptr}, block_2{nullptr};
  AeAttnBlock attn_1{nullptr};
};
TORCH_MODULE(AeMid);

struct AeEncoderImpl : torch::nn::Module {
  explicit AeEncoderImpl(const AutoencoderOptions& o);
  at::Tensor forward(const at::Tensor& x);  // [B, in, H, W] -> moments [B, 2·z, H/f, W/f]
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  torch::nn::ModuleList down{nullptr};  // AeLevel per level, level 0 first
  AeMid mid{nullptr};
  torch::nn::GroupNorm norm_out{nullptr};
};
TORCH_MODULE(AeEncoder);

struct AeDecoderImpl : torch::nn::Module {
  explicit AeDecoderImpl(const AutoencoderOptions& o);
  at::Tensor forward(const at::Tensor& z);  // [B, z, h, w] -> [B, out, h·f, w·f]
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  AeMid mid{nullptr};
  torch::nn::ModuleList up{nullptr};  // AeLevel per level, level 0 first; run from the last down
  torch::nn::GroupNorm norm_out{nullptr};
};
TORCH_MODULE(AeDecoder);

// The diagonal Gaussian the encoder's moments describe.
struct LatentMoments {
  at::Tensor mean, logvar;  // [B, z, h, w] each
};

struct AutoencoderImpl : torch::nn::Module {
  explicit AutoencoderImpl(AutoencoderOptions o);
  LatentMoments moments(const at::Tensor& x);
  // The scaled latent FLUX trains on: scale·(mean − shift), or of a sample drawn with `sample`
  // (mean + exp(logvar/2)·ε, ε from the generator).
  at::Tensor encode(const at::Tensor& x, std::optional<at::Generator> sample = std::nullopt);
  at::Tensor decode(const at::Tensor& z);  // of a scaled latent, images in about [-1, 1]
  AeEncoder encoder{nullptr};
  AeDecoder decoder{nullptr};
  AutoencoderOptions options;
};
TORCH_MODULE(Autoencoder);

}  // namespace flowtrain::models
