#include "data/shards/buckets.h"

#include "data/data_error.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace flowtrain::data {

std::vector<Bucket> parse_buckets(const std::vector<std::string>& specs) {
  std::vector<Bucket> buckets;
  for (const auto& spec : specs) {
    Bucket b;
    char sep = 0, extra = 0;
    long long h = 0, w = 0;
    if (std::sscanf(spec.c_str(), "%lld%c%lld%c", &h, &sep, &w, &extra) != 3 || (sep != 'x' && sep != 'X') || h < 1 ||
        w < 1)
      throw DataError(fmt::format("data.buckets: '{}' is not HxW (e.g. 48x64)", spec));
    b.height = h;
    b.width = w;
    for (const auto& other : buckets)
      if (other == b) throw DataError(fmt::format("data.buckets: {} is listed twice", spec));
    buckets.push_back(b);
  }
  return buckets;
}

int64_t nearest_bucket(const std::vector<Bucket>& buckets, int64_t height, int64_t width) {
  const double ratio = std::log(static_cast<double>(height) / static_cast<double>(width));
  int64_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double d = std::fabs(ratio - std::log(static_cast<double>(buckets[i].height) / buckets[i].width));
    if (d < best_distance - 1e-12) {
      best_distance = d;
      best = static_cast<int64_t>(i);
    }
  }
  return best;
}

at::Tensor fit_to_bucket(const at::Tensor& image, const Bucket& bucket) {
  const int64_t h = image.size(1), w = image.size(2);
  if (h == bucket.height && w == bucket.width) return image;
  // Cover: the smaller scale that makes both sides at least the bucket's.
  const double scale = std::max(static_cast<double>(bucket.height) / h, static_cast<double>(bucket.width) / w);
  const int64_t sh = std::max<int64_t>(bucket.height, std::llround(h * scale));
  const int64_t sw = std::max<int64_t>(bucket.width, std::llround(w * scale));
  at::Tensor x = image.unsqueeze(0).to(at::kFloat);
  x = scale < 1.0 ? at::_upsample_bilinear2d_aa(x, {sh, sw}, /*align_corners=*/false)
                  : at::upsample_bilinear2d(x, {sh, sw}, /*align_corners=*/false);
  const int64_t top = (sh - bucket.height) / 2, left = (sw - bucket.width) / 2;
  x = x.narrow(2, top, bucket.height).narrow(3, left, bucket.width);
  return x.squeeze(0).round_().clamp_(0, 255).to(at::kByte).contiguous();
}

}  // namespace flowtrain::data
