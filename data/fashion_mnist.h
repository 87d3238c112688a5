// Fashion-MNIST (Zalando): 28x28 grayscale images in 10 classes, 60k train / 10k test, read from
// the IDX .gz files that Debian's dataset-fashion-mnist installs in /usr/share/datasets/fashion-mnist.
#pragma once

#include "data/image_dataset.h"

#include <string>
#include <vector>

namespace flowtrain::data {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

// split is "train" (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz) or "test"
// (t10k-…). Returns images as [N, 1, 28, 28]. Throws DataError naming the path on a missing
// directory or file (with the apt-get hint), or a file of the wrong rank, mismatched counts, or
// a label >= 10.
ImageDataset load_fashion_mnist(const std::string& dir, const std::string& split);

// The 10 class names, indexed by label.
const std::vector<std::string>& fashion_mnist_class_names();

}  // namespace flowtrain::data
