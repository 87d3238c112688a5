// Aspect-ratio buckets: samples of different shapes trained in one run, each batch of one shape.
// data.buckets lists the shapes ("HxW", in pixels, or latent cells for latent members). A decoded
// image goes to the bucket whose aspect ratio is nearest its own (|log(h/w) − log(H/W)|; ties: the
// first listed), scaled (bilinear, antialiased when shrinking) to cover it and centre-cropped, as
// kohya's buckets do; a latent must already have a bucket's shape (latents are not resampled),
// else it is damage. The loader then fills each batch from one bucket (shard_loader.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::data {

struct Bucket {
  int64_t height = 0, width = 0;
  bool operator==(const Bucket& o) const { return height == o.height && width == o.width; }
};

// "48x64" -> {48, 64}; throws DataError naming the entry on anything else, or a repeated shape.
std::vector<Bucket> parse_buckets(const std::vector<std::string>& specs);

int64_t nearest_bucket(const std::vector<Bucket>& buckets, int64_t height, int64_t width);

// uint8 [C, h, w] -> uint8 [C, H, W] of the bucket: scaled to cover it, centre-cropped.
at::Tensor fit_to_bucket(const at::Tensor& image, const Bucket& bucket);

}  // namespace flowtrain::data
