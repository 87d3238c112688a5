// Helpers of the tests that compare flowtrain's models with the reference implementations'
// golden files (tests/reference/golden/, written by tests/reference/make_golden.py).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace flowtrain::test {

// tests/reference/golden/NAME in the source tree.
std::string golden_path(const std::string& name);

// "name d0,d1,…" for each parameter of the module, in its order: the line format of the
// *_keys.txt manifests (a reference model's state_dict with shapes).
std::vector<std::string> key_shape_lines(const torch::nn::Module& module);

// The lines of a golden text file, gzip'd (NAME.gz) or plain; fails the calling test (and returns
// none) when it is unreadable.
std::vector<std::string> golden_lines(const std::string& name);

// max |actual − expected| / max |expected|: one number for a whole tensor, robust to entries near 0.
double relative_max_error(const at::Tensor& actual, const at::Tensor& expected);

}  // namespace flowtrain::test
