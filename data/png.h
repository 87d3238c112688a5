// PNG output for sample grids and TensorBoard images (and PNG input, for tests), through libpng's
// simplified API.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace flowtrain::data {

// image: uint8 [H, W] (gray) or [H, W, 3] (RGB); CPU or CUDA (copied to CPU). Written to
// path + ".tmp", fsynced, then renamed over path, so a reader never sees a half-written PNG.
// Throws DataError naming the file on a bad tensor or an I/O / encoder failure.
void write_png(const std::string& path, const at::Tensor& image);

// The same encoding as write_png, returned as PNG file bytes in memory (for TensorBoard image
// summaries, which embed the PNG). Throws DataError on a bad tensor or an encoder failure.
std::string encode_png(const at::Tensor& image);

// Returns uint8 [H, W] for gray PNGs and [H, W, 3] for color ones; 16-bit images are reduced to
// 8 bits, palettes expanded, and alpha composited onto black. Throws DataError naming the file.
at::Tensor read_png(const std::string& path);
// The same from PNG bytes in memory (a tar member); `what` names them in errors.
at::Tensor decode_png(const std::string& bytes, const std::string& what);

// Tiles images (float [N, C, H, W] in [-1, 1], C = 1 or 3, any device) into one uint8 image:
// row-major, `nrow` images per row (fewer columns if N < nrow, as torchvision does), `padding`
// pixels of 0 between and around the tiles. Image k lands at
//   y = padding + (k / nrow) * (H + padding),  x = padding + (k % nrow) * (W + padding).
// Pixels map as u = floor((clamp(x, -1, 1) + 1) * 127.5 + 0.5), i.e. round-half-up of
// (x + 1) * 127.5: -1 -> 0, 0 -> 128, 1 -> 255; NaN is treated as -1 (black).
// Returns uint8 [H', W'] for C = 1, [H', W', 3] for C = 3. Throws DataError on bad arguments.
at::Tensor make_image_grid(const at::Tensor& images, int64_t nrow, int64_t padding = 2);

}  // namespace flowtrain::data
