// Small helpers shared by the test binaries: scratch directories and file access.
#pragma once

#include <string>

namespace flowtrain::test {

// A fresh, empty directory under the build tree's test-tmp/, unique to the calling test.
std::string scratch_dir(const std::string& name);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

// Where Fashion-MNIST lives: $FLOWTRAIN_FASHION_MNIST (e.g. unpacked from the .deb on the GPU
// machine) or Debian's /usr/share/datasets/fashion-mnist.
std::string fashion_mnist_dir();
bool have_fashion_mnist();

// Path of a file in the source tree (configs/…, tests/…).
std::string source_path(const std::string& relative);

}  // namespace flowtrain::test
