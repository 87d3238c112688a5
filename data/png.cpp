#include "data/png.h"

#include "data/data_error.h"

#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

namespace flowtrain::data {
namespace {

// libpng's simplified API reports errors through png_image::message instead of longjmp, which
// would skip C++ destructors; that is why we use it rather than png_create_write_struct.
png_image blank_image() {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  return image;
}

std::string errno_text() { return std::strerror(errno); }

// Checks the tensor and encodes it; `where` prefixes every error ("PNG file x.png: ").
std::string encode(const std::string& where, const at::Tensor& image) {
  if (!image.defined()) throw DataError(where + "image tensor is undefined");
  if (image.scalar_type() != at::kByte)
    throw DataError(where + "expected a uint8 image, got " + std::string(c10::toString(image.scalar_type())));
  const bool rgb = image.dim() == 3;
  if (!(image.dim() == 2 || (rgb && image.size(2) == 3)))
    throw DataError(where + "expected shape [H, W] or [H, W, 3], got " + c10::str(image.sizes()));
  const int64_t h = image.size(0), w = image.size(1);
  if (h < 1 || w < 1 || h > std::numeric_limits<int32_t>::max() || w > std::numeric_limits<int32_t>::max())
    throw DataError(where + "image size " + c10::str(image.sizes()) + " is not representable as a PNG");
  const at::Tensor pixels = image.to(at::kCPU).contiguous();

  png_image png = blank_image();
  png.width = static_cast<png_uint_32>(w);
  png.height = static_cast<png_uint_32>(h);
  png.format = rgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;

  // One pass into a buffer of libpng's documented worst-case size (raw pixels plus deflate and
  // chunk overhead), rather than a sizing pass that would compress the image twice.
  std::string bytes(PNG_IMAGE_PNG_SIZE_MAX(png), '\0');
  png_alloc_size_t size = bytes.size();
  const int ok = png_image_write_to_memory(&png, bytes.data(), &size, 0, pixels.data_ptr(), 0, nullptr);
  const std::string message = png.message;
  png_image_free(&png);
  if (!ok)
    throw DataError(where + "libpng: " +
                    (size > bytes.size() ? "needs " + std::to_string(size) + " bytes, more than its own bound" : message));
  bytes.resize(size);
  return bytes;
}

}  // namespace

std::string encode_png(const at::Tensor& image) { return encode("encode_png: ", image); }

void write_png(const std::string& path, const at::Tensor& image) {
  const std::string bytes = encode("PNG file " + path + ": ", image);

  const std::string tmp = path + ".tmp";
  FILE* file = std::fopen(tmp.c_str(), "wb");
  if (!file) throw DataError("cannot create PNG file " + tmp + ": " + errno_text());
  std::string error;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size() || std::fflush(file) != 0 ||
      ::fsync(::fileno(file)) != 0)
    error = errno_text();
  if (std::fclose(file) != 0 && error.empty()) error = errno_text();
  if (error.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) error = "rename from " + tmp + ": " + errno_text();
  if (!error.empty()) {
    std::remove(tmp.c_str());
    throw DataError("cannot write PNG file " + path + ": " + error);
  }
}

namespace {

// After png_image_begin_read_*: decodes to 8-bit gray or RGB; `what` names the source in errors.
at::Tensor finish_png_read(png_image& png, const std::string& what) {
  const bool rgb = (png.format & PNG_FORMAT_FLAG_COLOR) != 0;
  png.format = rgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  const int64_t h = png.height, w = png.width;
  at::Tensor out = rgb ? at::zeros({h, w, 3}, at::TensorOptions().dtype(at::kByte))
                       : at::zeros({h, w}, at::TensorOptions().dtype(at::kByte));
  const png_color black{0, 0, 0};
  if (!png_image_finish_read(&png, &black, out.data_ptr(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    throw DataError("cannot decode PNG " + what + ": " + message);
  }
  return out;
}

}  // namespace

at::Tensor read_png(const std::string& path) {
  png_image png = blank_image();
  if (!png_image_begin_read_from_file(&png, path.c_str()))
    throw DataError("cannot read PNG file " + path + ": " + png.message);
  return finish_png_read(png, "file " + path);
}

at::Tensor decode_png(const std::string& bytes, const std::string& what) {
  png_image png = blank_image();
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()))
    throw DataError("cannot read PNG " + what + ": " + png.message);
  return finish_png_read(png, what);
}

at::Tensor make_image_grid(const at::Tensor& images, int64_t nrow, int64_t padding) {
  if (!images.defined() || images.dim() != 4)
    throw DataError("make_image_grid: expected images of shape [N, C, H, W], got " +
                    (images.defined() ? c10::str(images.sizes()) : std::string("an undefined tensor")));
  if (!at::isFloatingType(images.scalar_type()))
    throw DataError("make_image_grid: expected floating-point images in [-1, 1], got " +
                    std::string(c10::toString(images.scalar_type())));
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  if (n < 1 || (c != 1 && c != 3) || h < 1 || w < 1)
    throw DataError("make_image_grid: expected N >= 1 images with C = 1 or 3 channels, got " + c10::str(images.sizes()));
  if (nrow < 1 || padding < 0)
    throw DataError("make_image_grid: expected nrow >= 1 and padding >= 0, got nrow " + std::to_string(nrow) +
                    ", padding " + std::to_string(padding));

  // float32 on CPU so that 0 maps to exactly 127.5 + 0.5 = 128 regardless of the input dtype.
  const at::Tensor x = at::nan_to_num(images.detach().to(at::kCPU, at::kFloat), -1.0).clamp(-1.0, 1.0);
  const at::Tensor u8 = ((x + 1.0) * 127.5 + 0.5).floor().to(at::kByte);

  const int64_t cols = std::min(nrow, n);
  const int64_t rows = (n + cols - 1) / cols;
  at::Tensor grid = at::zeros({c, rows * (h + padding) + padding, cols * (w + padding) + padding},
                              at::TensorOptions().dtype(at::kByte));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t y0 = padding + (k / cols) * (h + padding);
    const int64_t x0 = padding + (k % cols) * (w + padding);
    grid.narrow(1, y0, h).narrow(2, x0, w).copy_(u8[k]);
  }
  return c == 1 ? grid[0].contiguous() : grid.permute({1, 2, 0}).contiguous();
}

}  // namespace flowtrain::data
