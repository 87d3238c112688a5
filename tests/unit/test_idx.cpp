// IDX reader (gzip and plain) and the Fashion-MNIST loader on top of it: small files written here
// with zlib, and the real data set when Debian's dataset-fashion-mnist is installed.
#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <stdexcept>

namespace flowtrain::data {
namespace {

namespace fs = std::filesystem;


// Header bytes: 0x00 0x00 type ndim, then each dim as a big-endian u32.
std::string idx_header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string out = {'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(d >> shift));
  return out;
}

std::string iota_bytes(size_t n, int start = 0) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>((start + i) % 251);
  return out;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("test: cannot gzopen " + path);
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size()))
    throw std::runtime_error("test: gzwrite failed for " + path);
  if (gzclose(f) != Z_OK) throw std::runtime_error("test: gzclose failed for " + path);
}

TEST(IdxTest, ReadsGzipFile) {
  const std::string path = test::scratch_dir("idx") + "/a.gz";
  const std::string payload = iota_bytes(2 * 3 * 4);
  write_gz(path, idx_header(0x08, {2, 3, 4}) + payload);
  const IdxArray a = read_idx(path);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(std::string(a.bytes.begin(), a.bytes.end()), payload);
}

TEST(IdxTest, ReadsPlainFileAndLargeDims) {
  const std::string dir = test::scratch_dir("idx");
  const std::string payload = iota_bytes(300, 7);
  test::write_file(dir + "/labels", idx_header(0x08, {300}) + payload);
  const IdxArray a = read_idx(dir + "/labels");
  EXPECT_EQ(a.dims, std::vector<int64_t>{300});  // 300 needs the second big-endian byte
  EXPECT_EQ(std::string(a.bytes.begin(), a.bytes.end()), payload);

  write_gz(dir + "/empty.gz", idx_header(0x08, {0, 28}));
  const IdxArray e = read_idx(dir + "/empty.gz");
  EXPECT_EQ(e.dims, (std::vector<int64_t>{0, 28}));
  EXPECT_TRUE(e.bytes.empty());
}

TEST(IdxTest, RejectsWrongMagic) {
  const std::string dir = test::scratch_dir("idx");
  write_gz(dir + "/magic.gz", std::string("\x01\x00\x08\x01", 4) + std::string("\x00\x00\x00\x01\x05", 5));
  EXPECT_DATA_ERROR(read_idx(dir + "/magic.gz"), "IDX file " + dir + "/magic.gz: bad magic 0x01 0x00 0x08 0x01");

  write_gz(dir + "/type.gz", idx_header(0x0D, {1}) + std::string(4, '\0'));
  EXPECT_DATA_ERROR(read_idx(dir + "/type.gz"), "element type 0x0d is not supported (expected unsigned byte 0x08)");

  write_gz(dir + "/short.gz", std::string("\x00\x00", 2));
  EXPECT_DATA_ERROR(read_idx(dir + "/short.gz"), "file is 2 bytes, too short for the 4-byte magic");
}

TEST(IdxTest, RejectsTruncatedPayload) {
  const std::string path = test::scratch_dir("idx") + "/t.gz";
  write_gz(path, idx_header(0x08, {2, 3, 4}) + iota_bytes(20));
  EXPECT_DATA_ERROR(read_idx(path), "IDX file " + path + ": truncated payload: dims [2, 3, 4] need 24 bytes, got 20");
}

TEST(IdxTest, RejectsTrailingData) {
  const std::string path = test::scratch_dir("idx") + "/trailing.gz";
  write_gz(path, idx_header(0x08, {2, 3}) + iota_bytes(7));
  EXPECT_DATA_ERROR(read_idx(path), "trailing data after the 6-byte payload");
}

TEST(IdxTest, RejectsWrongNdim) {
  const std::string dir = test::scratch_dir("idx");
  write_gz(dir + "/zero.gz", idx_header(0x08, {}));
  EXPECT_DATA_ERROR(read_idx(dir + "/zero.gz"), "ndim is 0");

  // Claims 3 dimensions but the header stops after 2.
  write_gz(dir + "/header.gz", std::string("\x00\x00\x08\x03", 4) + std::string("\x00\x00\x00\x01\x00\x00\x00\x01", 8));
  EXPECT_DATA_ERROR(read_idx(dir + "/header.gz"), "truncated header: expected 3 dimensions");
}

TEST(IdxTest, RejectsCorruptGzip) {
  const std::string dir = test::scratch_dir("idx");
  const std::string good = dir + "/good.gz";
  std::string payload(64 * 64 * 16, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_gz(good, idx_header(0x08, {16, 64, 64}) + payload);
  const std::string bytes = test::read_file(good);
  ASSERT_GT(bytes.size(), 100u);

  std::string flipped = bytes;
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 8; ++i) flipped[i] = static_cast<char>(~flipped[i]);
  test::write_file(dir + "/flipped.gz", flipped);
  EXPECT_DATA_ERROR(read_idx(dir + "/flipped.gz"), "IDX file " + dir + "/flipped.gz: corrupt or truncated gzip stream: ");

  test::write_file(dir + "/cut.gz", bytes.substr(0, bytes.size() / 2));
  EXPECT_DATA_ERROR(read_idx(dir + "/cut.gz"), "corrupt or truncated gzip stream: ");

  EXPECT_DATA_ERROR(read_idx(dir + "/missing.gz"), "cannot open IDX file " + dir + "/missing.gz");
}

// A fake Fashion-MNIST directory with the given train files.
void write_split(const std::string& dir, const std::string& images, const std::string& labels) {
  write_gz(dir + "/train-images-idx3-ubyte.gz", images);
  write_gz(dir + "/train-labels-idx1-ubyte.gz", labels);
}

TEST(FashionMnistTest, LoadsSmallSplit) {
  const std::string dir = test::scratch_dir("fm");
  const std::string pixels = iota_bytes(3 * 2 * 5);
  write_split(dir, idx_header(0x08, {3, 2, 5}) + pixels, idx_header(0x08, {3}) + std::string("\x09\x00\x04", 3));
  const ImageDataset d = load_fashion_mnist(dir, "train");
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_EQ(d.images.scalar_type(), at::kByte);
  EXPECT_EQ(d.images.sizes(), at::IntArrayRef({3, 1, 2, 5}));
  EXPECT_EQ(d.images[1][0][1][2].item<int64_t>(), static_cast<uint8_t>(pixels[1 * 10 + 1 * 5 + 2]));
  EXPECT_EQ(d.labels.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(d.labels, at::tensor({int64_t{9}, int64_t{0}, int64_t{4}})));
}

TEST(FashionMnistTest, RejectsBadFiles) {
  const std::string dir = test::scratch_dir("fm");
  write_split(dir, idx_header(0x08, {3, 10}) + iota_bytes(30), idx_header(0x08, {3}) + iota_bytes(3));
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "train"), "train-images-idx3-ubyte.gz: expected 3 dimensions [N, H, W], got 2");

  write_split(dir, idx_header(0x08, {3, 2, 2}) + iota_bytes(12), idx_header(0x08, {3, 1}) + iota_bytes(3));
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "train"), "train-labels-idx1-ubyte.gz: expected 1 dimension [N], got 2");

  write_split(dir, idx_header(0x08, {3, 2, 2}) + iota_bytes(12), idx_header(0x08, {2}) + iota_bytes(2));
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "train"), "holds 2 labels but");

  write_split(dir, idx_header(0x08, {3, 2, 2}) + iota_bytes(12), idx_header(0x08, {3}) + std::string("\x01\x0a\x02", 3));
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "train"), "label 10 at index 1 is out of range");

  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "valid"), "unknown split 'valid'");
}

TEST(FashionMnistTest, MissingDirOrFileNamesPathAndPackage) {
  const std::string dir = test::scratch_dir("fm");
  EXPECT_DATA_ERROR(load_fashion_mnist(dir + "/nowhere", "train"), dir + "/nowhere");
  EXPECT_DATA_ERROR(load_fashion_mnist(dir + "/nowhere", "train"), "apt-get install dataset-fashion-mnist");
  write_split(dir, idx_header(0x08, {1, 1, 1}) + "x", idx_header(0x08, {1}) + std::string(1, '\0'));
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "test"), dir + "/t10k-images-idx3-ubyte.gz not found");
  EXPECT_DATA_ERROR(load_fashion_mnist(dir, "test"), "apt-get install dataset-fashion-mnist");
}

TEST(FashionMnistTest, ClassNames) {
  const auto& names = fashion_mnist_class_names();
  ASSERT_EQ(names.size(), 10u);
  EXPECT_EQ(names[0], "T-shirt/top");
  EXPECT_EQ(names[5], "Sandal");
  EXPECT_EQ(names[9], "Ankle boot");
}

TEST(FashionMnistTest, RealDatasetWhenInstalled) {
  REQUIRE_DATA();
  const ImageDataset train = load_fashion_mnist(flowtrain::test::fashion_mnist_dir(), "train");
  EXPECT_EQ(train.images.sizes(), at::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.sizes(), at::IntArrayRef({60000}));
  EXPECT_TRUE(at::equal(at::bincount(train.labels), at::full({10}, 6000, at::TensorOptions().dtype(at::kLong))));
  // Real images use the full 0..255 range (an all-zero read would pass the shape checks).
  EXPECT_EQ(train.images.max().item<int64_t>(), 255);
  EXPECT_EQ(train.images.min().item<int64_t>(), 0);

  const ImageDataset test_split = load_fashion_mnist(flowtrain::test::fashion_mnist_dir(), "test");
  EXPECT_EQ(test_split.images.sizes(), at::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_TRUE(at::equal(at::bincount(test_split.labels), at::full({10}, 1000, at::TensorOptions().dtype(at::kLong))));
}

}  // namespace
}  // namespace flowtrain::data
