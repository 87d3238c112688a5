// PNG write/read round trips and the sample-grid layout and pixel mapping.
#include "data/data_error.h"
#include "data/png.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace flowtrain::data {
namespace {

namespace fs = std::filesystem;


at::Tensor random_u8(at::IntArrayRef shape) {
  return at::randint(0, 256, shape, at::TensorOptions().dtype(at::kByte));
}

TEST(PngTest, RoundTripsGray) {
  at::manual_seed(3);
  const std::string path = test::scratch_dir("png") + "/gray.png";
  const at::Tensor image = random_u8({17, 23});
  write_png(path, image);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(test::read_file(path).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  const at::Tensor back = read_png(path);
  EXPECT_EQ(back.scalar_type(), at::kByte);
  EXPECT_EQ(back.sizes(), at::IntArrayRef({17, 23}));
  EXPECT_TRUE(at::equal(back, image));
}

TEST(PngTest, RoundTripsRgb) {
  at::manual_seed(4);
  const std::string path = test::scratch_dir("png") + "/rgb.png";
  const at::Tensor image = random_u8({9, 11, 3});
  write_png(path, image);
  const at::Tensor back = read_png(path);
  EXPECT_EQ(back.sizes(), at::IntArrayRef({9, 11, 3}));
  EXPECT_TRUE(at::equal(back, image));

  // A non-contiguous view (HWC from CHW) is written as the values it shows.
  const at::Tensor chw = random_u8({3, 5, 7});
  write_png(path, chw.permute({1, 2, 0}));
  EXPECT_TRUE(at::equal(read_png(path), chw.permute({1, 2, 0})));
}

TEST(PngTest, RejectsBadImagesAndFiles) {
  const std::string dir = test::scratch_dir("png");
  EXPECT_DATA_ERROR(write_png(dir + "/f.png", at::zeros({4, 4})), "expected a uint8 image");
  EXPECT_DATA_ERROR(write_png(dir + "/f.png", random_u8({4, 4, 4})), "expected shape [H, W] or [H, W, 3]");
  EXPECT_DATA_ERROR(write_png(dir + "/f.png", random_u8({0, 4})), dir + "/f.png");
  EXPECT_DATA_ERROR(write_png(dir + "/no/such/dir/f.png", random_u8({4, 4})), "cannot create PNG file");
  EXPECT_FALSE(fs::exists(dir + "/f.png"));

  EXPECT_DATA_ERROR(read_png(dir + "/missing.png"), "cannot read PNG file " + dir + "/missing.png");
  test::write_file(dir + "/garbage.png", "definitely not a png file");
  EXPECT_DATA_ERROR(read_png(dir + "/garbage.png"), dir + "/garbage.png");

  // A valid signature and header but a cut-off image stream.
  write_png(dir + "/whole.png", random_u8({64, 64, 3}));
  const std::string whole = test::read_file(dir + "/whole.png");
  test::write_file(dir + "/cut.png", whole.substr(0, whole.size() / 2));
  EXPECT_DATA_ERROR(read_png(dir + "/cut.png"), "cannot decode PNG file " + dir + "/cut.png");
}

TEST(PngTest, GridPixelMapping) {
  // u = round-half-up((x + 1) * 127.5) after clamping to [-1, 1]; NaN counts as -1.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor x = at::tensor({-1.f, 1.f, 0.f, 0.5f, -0.5f, 3.f, -7.f, nan, 1.f / 255.f}).view({1, 1, 1, 9});
  const at::Tensor grid = make_image_grid(x, 1, 0);
  ASSERT_EQ(grid.sizes(), at::IntArrayRef({1, 9}));
  EXPECT_EQ(grid.scalar_type(), at::kByte);
  // 0.5 -> 191.25 -> 191; -0.5 -> 63.75 -> 64; 1/255 -> 128.0 -> 128.
  const std::vector<int64_t> expected = {0, 255, 128, 191, 64, 255, 0, 0, 128};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(grid[0][i].item<int64_t>(), expected[i]) << "pixel " << i;
}

TEST(PngTest, GridLayoutGray) {
  // 5 images of 3x4, 2 per row, padding 2: 3 rows of tiles.
  const int64_t n = 5, h = 3, w = 4, nrow = 2, pad = 2;
  at::Tensor images = at::empty({n, 1, h, w});
  for (int64_t k = 0; k < n; ++k) images[k].fill_(-1.0 + 0.25 * static_cast<double>(k + 1));  // never exactly -1
  images[3][0][0][0] = 1.0;  // a distinct top-left pixel
  const at::Tensor grid = make_image_grid(images, nrow, pad);
  ASSERT_EQ(grid.sizes(), at::IntArrayRef({3 * (h + pad) + pad, nrow * (w + pad) + pad}));

  for (int64_t k = 0; k < n; ++k) {
    SCOPED_TRACE("image " + std::to_string(k));
    const int64_t y0 = pad + (k / nrow) * (h + pad), x0 = pad + (k % nrow) * (w + pad);
    const int64_t value = static_cast<int64_t>(std::floor(0.25 * (k + 1) * 127.5 + 0.5));
    EXPECT_EQ(grid[y0 + h - 1][x0 + w - 1].item<int64_t>(), value);  // bottom-right of the tile
    EXPECT_EQ(grid[y0][x0].item<int64_t>(), k == 3 ? 255 : value);   // top-left of the tile
    EXPECT_EQ(grid[y0 - 1][x0].item<int64_t>(), 0);                   // padding above
    EXPECT_EQ(grid[y0][x0 - 1].item<int64_t>(), 0);                   // padding to the left
    EXPECT_EQ(grid[y0 + h][x0 + w].item<int64_t>(), 0);               // padding below-right
  }
  // Image 3 sits in row 1, column 1.
  EXPECT_EQ(grid[pad + 1 * (h + pad)][pad + 1 * (w + pad)].item<int64_t>(), 255);
  // The empty slot after the last image stays black.
  EXPECT_EQ(grid.narrow(0, pad + 2 * (h + pad), h).narrow(1, pad + (w + pad), w).max().item<int64_t>(), 0);
  // Tiles cover 5 * 12 pixels; everything else is padding.
  EXPECT_EQ(grid.ne(0).sum().item<int64_t>(), n * h * w);
}

TEST(PngTest, GridLayoutRgbAndFewImages) {
  // 2 RGB images, nrow 4: only 2 columns (as torchvision), channels last in the output.
  at::Tensor images = at::full({2, 3, 2, 2}, -1.0);
  images[0][0].fill_(1.0);  // image 0 red
  images[1][2].fill_(1.0);  // image 1 blue
  const at::Tensor grid = make_image_grid(images, 4, 1);
  ASSERT_EQ(grid.sizes(), at::IntArrayRef({1 * (2 + 1) + 1, 2 * (2 + 1) + 1, 3}));
  EXPECT_TRUE(at::equal(grid[1][1], at::tensor({255, 0, 0}).to(at::kByte)));
  EXPECT_TRUE(at::equal(grid[2][2], at::tensor({255, 0, 0}).to(at::kByte)));
  EXPECT_TRUE(at::equal(grid[1][4], at::tensor({0, 0, 255}).to(at::kByte)));
  EXPECT_TRUE(at::equal(grid[1][3], at::tensor({0, 0, 0}).to(at::kByte)));  // padding between

  // With no padding the grid is the images side by side.
  const at::Tensor flat = make_image_grid(images, 2, 0);
  const at::Tensor expected = at::cat({images[0], images[1]}, 2).permute({1, 2, 0}).add(1).mul(127.5).round().to(at::kByte);
  EXPECT_TRUE(at::equal(flat, expected));

  // The grid is a valid PNG image.
  const std::string path = test::scratch_dir("png") + "/grid.png";
  write_png(path, grid);
  EXPECT_TRUE(at::equal(read_png(path), grid));
}

TEST(PngTest, GridRejectsBadArguments) {
  EXPECT_DATA_ERROR(make_image_grid(at::zeros({2, 2, 4, 4}), 2), "C = 1 or 3");
  EXPECT_DATA_ERROR(make_image_grid(at::zeros({4, 4}), 2), "expected images of shape [N, C, H, W]");
  EXPECT_DATA_ERROR(make_image_grid(at::zeros({1, 1, 4, 4}), 0), "nrow >= 1");
  EXPECT_DATA_ERROR(make_image_grid(at::zeros({1, 1, 4, 4}, at::TensorOptions().dtype(at::kByte)), 1), "floating-point");
}

}  // namespace
}  // namespace flowtrain::data
