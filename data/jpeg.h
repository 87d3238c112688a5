// JPEG input (shard members) and output (tests, packing) through libjpeg-turbo's libjpeg API.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace flowtrain::data {

// JPEG bytes -> uint8 [H, W, 3] (colour) or [H, W] (grayscale); CMYK and other colour spaces are
// converted to RGB by libjpeg. `what` names the bytes in errors. Throws DataError on any
// decoder error, including a truncated or corrupt stream (libjpeg's warnings count as errors:
// a damaged JPEG must not train as a half-grey image).
at::Tensor decode_jpeg(const std::string& bytes, const std::string& what);

// uint8 [H, W] or [H, W, 3] -> JPEG bytes at `quality` (1–100).
std::string encode_jpeg(const at::Tensor& image, int quality = 95);

}  // namespace flowtrain::data
