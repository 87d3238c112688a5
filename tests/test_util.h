// Small helpers shared by the test binaries: scratch directories and file access.
#pragma once

#include "data/data_error.h"

#include <gtest/gtest.h>

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

// The message of the DataError that `f` throws, or "<no DataError thrown>".
template <typename F>
std::string data_error_message(F&& f) {
  try {
    f();
  } catch (const data::DataError& e) {
    return e.what();
  }
  return "<no DataError thrown>";
}

}  // namespace flowtrain::test

// Skips a test that needs the real Fashion-MNIST files when they are not installed.
#define REQUIRE_DATA()                       \
  if (!::flowtrain::test::have_fashion_mnist()) \
  GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)"

// Expects `statement` to throw a DataError whose message contains `substring`.
#define EXPECT_DATA_ERROR(statement, substring)                                            \
  do {                                                                                     \
    const std::string message_ = ::flowtrain::test::data_error_message([&] { statement; }); \
    EXPECT_NE(message_.find(substring), std::string::npos) << "message: " << message_;     \
  } while (0)
