#include "data/fashion_mnist.h"

#include "data/data_error.h"
#include "data/idx.h"

#include <sys/stat.h>

#include <cstring>

namespace flowtrain::data {
namespace {

constexpr int64_t kNumClasses = 10;
constexpr const char* kInstallHint = " (install it with `apt-get install dataset-fashion-mnist`)";

// stat() rather than std::filesystem: the LibTorch wheel exports its own copies of the
// std::filesystem symbols, which interpose the system libstdc++'s and are not all safe to call.
bool is_mode(const std::string& path, mode_t type) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == type;
}

std::string require_file(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/" + name;
  if (!is_mode(file, S_IFREG)) throw DataError("Fashion-MNIST file " + file + " not found" + kInstallHint);
  return file;
}

}  // namespace

ImageDataset load_fashion_mnist(const std::string& dir, const std::string& split) {
  std::string prefix;
  if (split == "train") prefix = "train";
  else if (split == "test") prefix = "t10k";
  else throw DataError("Fashion-MNIST in " + dir + ": unknown split '" + split + "' (expected \"train\" or \"test\")");

  if (!is_mode(dir, S_IFDIR))
    throw DataError("Fashion-MNIST directory " + dir + " not found" + kInstallHint);
  const std::string images_path = require_file(dir, prefix + "-images-idx3-ubyte.gz");
  const std::string labels_path = require_file(dir, prefix + "-labels-idx1-ubyte.gz");

  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3)
    throw DataError("Fashion-MNIST images " + images_path + ": expected 3 dimensions [N, H, W], got " +
                    std::to_string(images.dims.size()));
  if (labels.dims.size() != 1)
    throw DataError("Fashion-MNIST labels " + labels_path + ": expected 1 dimension [N], got " +
                    std::to_string(labels.dims.size()));
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n)
    throw DataError("Fashion-MNIST " + labels_path + " holds " + std::to_string(labels.dims[0]) + " labels but " +
                    images_path + " holds " + std::to_string(n) + " images (expected equal counts)");
  for (size_t i = 0; i < labels.bytes.size(); ++i)
    if (labels.bytes[i] >= kNumClasses)
      throw DataError("Fashion-MNIST labels " + labels_path + ": label " + std::to_string(labels.bytes[i]) +
                      " at index " + std::to_string(i) + " is out of range (expected 0.." +
                      std::to_string(kNumClasses - 1) + ")");

  ImageDataset out;
  out.num_classes = kNumClasses;
  out.images = at::empty({n, 1, images.dims[1], images.dims[2]}, at::TensorOptions().dtype(at::kByte));
  if (!images.bytes.empty()) std::memcpy(out.images.data_ptr(), images.bytes.data(), images.bytes.size());
  out.labels = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (!labels.bytes.empty()) std::memcpy(out.labels.data_ptr(), labels.bytes.data(), labels.bytes.size());
  out.labels = out.labels.to(at::kLong);
  return out;
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

}  // namespace flowtrain::data
