// The manifest.json that `flowtrain data make-compositions` and `make-moving-fashion` write beside
// their data: the judges read from it which Fashion-MNIST directory their classifier trains on.
#pragma once

#include "data/data_error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace flowtrain::trainer {

// One field of DIR/manifest.json; DataError naming the file when it cannot be read or lacks `key`.
template <typename T>
T manifest_field(const std::string& data_dir, const char* key) {
  const auto path = std::filesystem::path(data_dir) / "manifest.json";
  std::ifstream f(path);
  if (!f) throw data::DataError(fmt::format("{}: cannot open (not a data set made by `flowtrain data make-…`?)", path.string()));
  try {
    return nlohmann::json::parse(f).at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw data::DataError(fmt::format("{}: no {} ({})", path.string(), key, e.what()));
  }
}

inline std::string fashion_dir_of(const std::string& data_dir) {
  return manifest_field<std::string>(data_dir, "fashion_mnist_dir");
}

}  // namespace flowtrain::trainer
