#include "trainer/telemetry/key_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <stdexcept>

namespace flowtrain::trainer {
namespace fs = std::filesystem;

std::string key_log_path(const std::string& out_dir, int64_t dp_rank) {
  return (fs::path(out_dir) / "data" / fmt::format("keys-rank-{:05d}.txt", dp_rank)).string();
}

void truncate_key_log(const std::string& path, int64_t lines) {
  if (!fs::exists(path)) {
    if (lines > 0) throw std::runtime_error(fmt::format("{}: missing, but the checkpoint says it held {} keys", path, lines));
    return;
  }
  std::ifstream in(path, std::ios::binary);
  uint64_t offset = 0;
  std::string line;
  for (int64_t n = 0; n < lines; ++n) {
    if (!std::getline(in, line)) {
      // Lines written but lost in a host crash (the file is flushed, not fsynced, each step):
      // keep what is there; the audit trail has a gap, the training does not.
      spdlog::warn("{}: holds {} keys, fewer than the {} its checkpoint covers; appending after them", path, n, lines);
      return;
    }
    offset += line.size() + 1;
  }
  in.close();
  fs::resize_file(path, offset);
}

KeyLog::KeyLog(const std::string& out_dir, int64_t dp_rank, int64_t lines) : path_(key_log_path(out_dir, dp_rank)) {
  fs::create_directories(fs::path(path_).parent_path());
  truncate_key_log(path_, lines);
  out_.open(path_, std::ios::app);
  if (!out_) throw std::runtime_error(fmt::format("{}: cannot open for appending", path_));
}

void KeyLog::append(const std::vector<std::string>& keys) {
  for (const auto& k : keys) out_ << k << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("{}: write failed", path_));
}

}  // namespace flowtrain::trainer
