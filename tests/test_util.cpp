#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace flowtrain::test {

std::string scratch_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string unique = name;
  if (info) unique = std::string(info->test_suite_name()) + "." + info->name() + "." + name;
  fs::path dir = fs::path(FLOWTRAIN_TEST_TMP) / unique;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("test: cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("test: cannot write " + path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("FLOWTRAIN_FASHION_MNIST");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

bool have_fashion_mnist() { return fs::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz"); }

bool in_ci() {
  const char* v = std::getenv("CI");
  return v && (std::string(v) == "true" || std::string(v) == "1");
}

std::string source_path(const std::string& relative) {
  return (fs::path(FLOWTRAIN_SOURCE_DIR) / relative).string();
}

models::DiT perturbed_small_dit(int64_t depth, uint64_t seed) {
  models::DiTOptions o;
  o.input_size = 8;
  o.patch = 2;
  o.in_channels = 4;
  o.hidden = 32;
  o.depth = depth;
  o.heads = 2;
  o.num_classes = 10;
  o.learn_sigma = false;
  at::manual_seed(seed);
  models::DiT m(o);
  at::NoGradGuard no_grad;
  for (auto& p : m->parameters())
    if (p.requires_grad()) p.add_(at::randn(p.sizes()) * 0.05);
  return m;
}

}  // namespace flowtrain::test
