#include "reference_golden.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <sstream>
#include <zlib.h>

namespace flowtrain::test {

std::string golden_path(const std::string& name) { return source_path("tests/reference/golden/" + name); }

std::vector<std::string> key_shape_lines(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  for (const auto& p : module.named_parameters()) {
    std::string line = p.key() + " ";
    for (int64_t i = 0; i < p.value().dim(); ++i) line += (i ? "," : "") + std::to_string(p.value().size(i));
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> golden_lines(const std::string& name) {
  gzFile in = gzopen(golden_path(name).c_str(), "rb");  // gzip'd or plain
  if (in == nullptr) {
    ADD_FAILURE() << "cannot read " << golden_path(name);
    return {};
  }
  std::string text;
  char buffer[1 << 16];
  for (int got; (got = gzread(in, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(got));
  gzclose(in);
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

double relative_max_error(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

}  // namespace flowtrain::test
