// Small helpers shared by the test binaries: scratch directories, file access, a small DiT.
#pragma once

#include "data/data_error.h"
#include "models/dit/dit.h"

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
// CI=true (or 1) in the environment: what must run may not be skipped.
bool in_ci();

// A small DiT (8×8×4 inputs, patch 2, hidden 32, 2 heads, 10 classes, `depth` blocks) whose
// weights are moved off the reference init by N(0, 0.05²) noise drawn after seeding the global
// generator with `seed`: at the adaLN-Zero init the blocks are identities and most gradients
// zero, which would make gradient comparisons vacuous.
models::DiT perturbed_small_dit(int64_t depth, uint64_t seed);

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

// A test that needs the real Fashion-MNIST files: skipped when they are not installed on a
// developer's machine, failed in CI (CI=true, set by .ci/run), where a skip would count as a pass
// for a test that never ran.
#define REQUIRE_DATA()                                                                             \
  do {                                                                                             \
    if (::flowtrain::test::have_fashion_mnist()) break;                                            \
    if (::flowtrain::test::in_ci())                                                                \
      FAIL() << "dataset-fashion-mnist is not installed at " << ::flowtrain::test::fashion_mnist_dir() \
             << " and CI=true: scripts/setup.sh must install it";                                  \
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup.sh installs it)";        \
  } while (0)

// Expects `statement` to throw a DataError whose message contains `substring`.
#define EXPECT_DATA_ERROR(statement, substring)                                            \
  do {                                                                                     \
    const std::string message_ = ::flowtrain::test::data_error_message([&] { statement; }); \
    EXPECT_NE(message_.find(substring), std::string::npos) << "message: " << message_;     \
  } while (0)
