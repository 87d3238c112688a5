#include "models/autoencoder/autoencoder.h"

#include <stdexcept>
#include <string>

namespace flowtrain::models {

namespace {

torch::nn::GroupNorm group_norm(int64_t channels, int64_t groups) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(1e-6).affine(true));
}

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1) {
  // 3×3 convs keep the size (padding 1) except the Downsample's, which pads by hand.
  const int64_t padding = kernel == 3 && stride == 1 ? 1 : 0;
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
}

// The widths of level i: its ResnetBlocks go from in_width(i) to width(i) (reference: block_in
// = ch · in_ch_mult[i], in_ch_mult = (1,) + ch_mult).
int64_t width(const AutoencoderOptions& o, int64_t level) { return o.ch * o.ch_mult.at(level); }
int64_t in_width(const AutoencoderOptions& o, int64_t level) { return level == 0 ? o.ch : width(o, level - 1); }

void check(const AutoencoderOptions& o) {
  if (o.ch_mult.empty()) throw std::invalid_argument("autoencoder: ch_mult is empty");
  for (int64_t level = 0; level < o.levels(); ++level)
    if (width(o, level) % o.norm_groups != 0 || in_width(o, level) % o.norm_groups != 0)
      throw std::invalid_argument("autoencoder: every width (ch · ch_mult) must be a multiple of the " +
                                  std::to_string(o.norm_groups) + " GroupNorm groups");
}

int64_t conv_params(int64_t in, int64_t out, int64_t kernel) { return in * out * kernel * kernel + out; }
int64_t resnet_params(int64_t in, int64_t out) {
  return 2 * in + conv_params(in, out, 3) + 2 * out + conv_params(out, out, 3) + (in != out ? conv_params(in, out, 1) : 0);
}
int64_t mid_params(int64_t c) { return 2 * resnet_params(c, c) + 2 * c + 4 * conv_params(c, c, 1); }

}  // namespace

AutoencoderOptions flux_autoencoder_options() { return AutoencoderOptions{}; }

int64_t autoencoder_parameter_count(const AutoencoderOptions& o) {
  const int64_t last = width(o, o.levels() - 1);
  int64_t n = conv_params(o.in_channels, o.ch, 3);  // encoder
  for (int64_t level = 0; level < o.levels(); ++level) {
    int64_t in = in_width(o, level);
    for (int64_t b = 0; b < o.num_res_blocks; ++b, in = width(o, level)) n += resnet_params(in, width(o, level));
    if (level != o.levels() - 1) n += conv_params(width(o, level), width(o, level), 3);
  }
  n += mid_params(last) + 2 * last + conv_params(last, 2 * o.z_channels, 3);
  n += conv_params(o.z_channels, last, 3) + mid_params(last);  // decoder
  int64_t in = last;
  for (int64_t level = o.levels() - 1; level >= 0; --level) {
    for (int64_t b = 0; b <= o.num_res_blocks; ++b, in = width(o, level)) n += resnet_params(in, width(o, level));
    if (level != 0) n += conv_params(width(o, level), width(o, level), 3);
  }
  return n + 2 * width(o, 0) + conv_params(width(o, 0), o.out_channels, 3);
}

at::Tensor swish(const at::Tensor& x) { return at::silu(x); }

AeResnetBlockImpl::AeResnetBlockImpl(int64_t in_channels, int64_t out_channels, int64_t groups) {
  norm1 = register_module("norm1", group_norm(in_channels, groups));
  conv1 = register_module("conv1", conv(in_channels, out_channels, 3));
  norm2 = register_module("norm2", group_norm(out_channels, groups));
  conv2 = register_module("conv2", conv(out_channels, out_channels, 3));
  if (in_channels != out_channels) nin_shortcut = register_module("nin_shortcut", conv(in_channels, out_channels, 1));
}

at::Tensor AeResnetBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv1(swish(norm1(x)));
  h = conv2(swish(norm2(h)));
  return (nin_shortcut ? nin_shortcut(x) : x) + h;
}

AeAttnBlockImpl::AeAttnBlockImpl(int64_t channels, int64_t groups) {
  norm = register_module("norm", group_norm(channels, groups));
  q = register_module("q", conv(channels, channels, 1));
  k = register_module("k", conv(channels, channels, 1));
  v = register_module("v", conv(channels, channels, 1));
  proj_out = register_module("proj_out", conv(channels, channels, 1));
}

at::Tensor AeAttnBlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = norm(x);
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // "b c h w -> b 1 (h w) c": one head whose features are all C channels.
  auto tokens = [&](const at::Tensor& t) { return t.reshape({B, 1, C, H * W}).transpose(2, 3); };
  const at::Tensor a = at::scaled_dot_product_attention(tokens(q(h)), tokens(k(h)), tokens(v(h)));
  return x + proj_out(a.transpose(2, 3).reshape({B, C, H, W}));
}

AeResampleImpl::AeResampleImpl(int64_t channels, bool down) : down(down) {
  conv = register_module("conv", down ? models::conv(channels, channels, 3, 2) : models::conv(channels, channels, 3));
}

at::Tensor AeResampleImpl::forward(const at::Tensor& x) {
  if (down) return conv(at::constant_pad_nd(x, {0, 1, 0, 1}, 0));  // right and bottom only
  return conv(at::upsample_nearest2d(x, {2 * x.size(2), 2 * x.size(3)}, 2.0, 2.0));
}

at::Tensor AeLevelImpl::forward(at::Tensor x) {
  for (const auto& b : *block) x = b->as<AeResnetBlock>()->forward(x);
  return resample ? resample(x) : x;
}

AeMidImpl::AeMidImpl(int64_t channels, int64_t groups) {
  block_1 = register_module("block_1", AeResnetBlock(channels, channels, groups));
  attn_1 = register_module("attn_1", AeAttnBlock(channels, groups));
  block_2 = register_module("block_2", AeResnetBlock(channels, channels, groups));
}

at::Tensor AeMidImpl::forward(const at::Tensor& x) { return block_2(attn_1(block_1(x))); }

AeEncoderImpl::AeEncoderImpl(const AutoencoderOptions& o) {
  check(o);
  conv_in = register_module("conv_in", conv(o.in_channels, o.ch, 3));
  down = register_module("down", torch::nn::ModuleList());
  for (int64_t level = 0; level < o.levels(); ++level) {
    AeLevel l;
    l->block = l->register_module("block", torch::nn::ModuleList());
    int64_t in = in_width(o, level);
    for (int64_t b = 0; b < o.num_res_blocks; ++b, in = width(o, level))
      l->block->push_back(AeResnetBlock(in, width(o, level), o.norm_groups));
    if (level != o.levels() - 1) l->resample = l->register_module("downsample", AeResample(width(o, level), true));
    down->push_back(l);
  }
  const int64_t last = width(o, o.levels() - 1);
  mid = register_module("mid", AeMid(last, o.norm_groups));
  norm_out = register_module("norm_out", group_norm(last, o.norm_groups));
  conv_out = register_module("conv_out", conv(last, 2 * o.z_channels, 3));
}

at::Tensor AeEncoderImpl::forward(const at::Tensor& x) {
  at::Tensor h = conv_in(x);
  for (const auto& level : *down) h = level->as<AeLevel>()->forward(h);
  return conv_out(swish(norm_out(mid(h))));
}

AeDecoderImpl::AeDecoderImpl(const AutoencoderOptions& o) {
  check(o);
  const int64_t last = width(o, o.levels() - 1);
  conv_in = register_module("conv_in", conv(o.z_channels, last, 3));
  mid = register_module("mid", AeMid(last, o.norm_groups));
  // Built from the last level down (each level's first block takes the level above's width) but
  // indexed by level, as the reference's up.insert(0, …).
  std::vector<AeLevel> levels(o.levels(), nullptr);
  int64_t in = last;
  for (int64_t level = o.levels() - 1; level >= 0; --level) {
    AeLevel l;
    l->block = l->register_module("block", torch::nn::ModuleList());
    for (int64_t b = 0; b <= o.num_res_blocks; ++b, in = width(o, level))
      l->block->push_back(AeResnetBlock(in, width(o, level), o.norm_groups));
    if (level != 0) l->resample = l->register_module("upsample", AeResample(width(o, level), false));
    levels[level] = l;
  }
  up = register_module("up", torch::nn::ModuleList());
  for (const auto& l : levels) up->push_back(l);
  norm_out = register_module("norm_out", group_norm(width(o, 0), o.norm_groups));
  conv_out = register_module("conv_out", conv(width(o, 0), o.out_channels, 3));
}

at::Tensor AeDecoderImpl::forward(const at::Tensor& z) {
  at::Tensor h = mid(conv_in(z));
  for (int64_t level = static_cast<int64_t>(up->size()) - 1; level >= 0; --level)
    h = up[level]->as<AeLevel>()->forward(h);
  return conv_out(swish(norm_out(h)));
}

AutoencoderImpl::AutoencoderImpl(AutoencoderOptions o) : options(std::move(o)) {
  encoder = register_module("encoder", AeEncoder(options));
  decoder = register_module("decoder", AeDecoder(options));
}

LatentMoments AutoencoderImpl::moments(const at::Tensor& x) {
  const std::vector<at::Tensor> halves = encoder(x).chunk(2, 1);
  return {halves[0], halves[1]};
}

at::Tensor AutoencoderImpl::encode(const at::Tensor& x, std::optional<at::Generator> sample) {
  const LatentMoments m = moments(x);
  at::Tensor z = m.mean;
  if (sample) {
    const at::Tensor eps = at::randn(m.mean.sizes(), *sample, m.mean.options());
    z = m.mean + at::exp(0.5 * m.logvar) * eps;
  }
  return options.scale_factor * (z - options.shift_factor);
}

at::Tensor AutoencoderImpl::decode(const at::Tensor& z) {
  return decoder(z / options.scale_factor + options.shift_factor);
}

}  // namespace flowtrain::models
