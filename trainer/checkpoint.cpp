#include "trainer/checkpoint.h"

#include "data/safetensors.h"
#include "trainer/file_util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

namespace fs = std::filesystem;
using nlohmann::json;

namespace flowtrain::trainer {

namespace {

constexpr const char* kFormat = "flowtrain.checkpoint";
constexpr int kVersion = 1;

std::optional<int64_t> parse_step_dir(const std::string& name) {
  static const std::regex re("^step-([0-9]{7,})$");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

// Fault injection for the crash-consistency test: FLOWTRAIN_FAULT_CHECKPOINT_PAUSE="STEP:SECONDS"
// sleeps after the first file of that step's checkpoint is written, so a test can SIGKILL the
// process mid-save deterministically. Unset in normal runs.
void maybe_pause_for_fault_injection(int64_t step) {
  const char* spec = std::getenv("FLOWTRAIN_FAULT_CHECKPOINT_PAUSE");
  if (!spec) return;
  int64_t at_step = -1;
  double seconds = 0;
  if (std::sscanf(spec, "%ld:%lf", &at_step, &seconds) == 2 && at_step == step)
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

json state_json(const data::LoaderState& s) { return {{"epoch", s.epoch}, {"position", s.position}}; }

template <typename T>
T required(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key)) throw CheckpointError(fmt::format("{}: manifest has no '{}'", file, key));
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: manifest field '{}' has the wrong type: {}", file, key, e.what()));
  }
}

json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  if (!fs::exists(path)) throw CheckpointError(fmt::format("{}: missing (incomplete checkpoint?)", path));
  json manifest;
  try {
    manifest = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (manifest.value("format", "") != kFormat)
    throw CheckpointError(fmt::format("{}: not a flowtrain checkpoint manifest", path));
  if (manifest.value("version", 0) != kVersion)
    throw CheckpointError(fmt::format("{}: checkpoint format version {} is not supported (this build reads {})",
                                      path, manifest.value("version", 0), kVersion));
  return manifest;
}

void verify_files(const std::string& dir, const json& manifest) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  const json files = required<json>(manifest, "files", mpath);  // named: items() must not outlive it
  for (const auto& [name, info] : files.items()) {
    const std::string path = (fs::path(dir) / name).string();
    if (!fs::exists(path)) throw CheckpointError(fmt::format("{}: missing", path));
    FileDigest d = digest_file(path);
    const auto bytes = info.at("bytes").get<uint64_t>();
    if (d.bytes != bytes)
      throw CheckpointError(fmt::format("{}: {} bytes, the manifest says {} (truncated?)", path, d.bytes, bytes));
    if (d.crc32 != info.at("crc32").get<uint32_t>())
      throw CheckpointError(fmt::format("{}: CRC-32 mismatch (file corrupted)", path));
  }
}

}  // namespace

std::string checkpoint_name(int64_t step) { return fmt::format("step-{:07d}", step); }

std::string save_checkpoint(const std::string& checkpoints_dir, const CheckpointContents& c) {
  const std::string name = checkpoint_name(c.progress.step);
  const fs::path final_dir = fs::path(checkpoints_dir) / name;
  const fs::path tmp_dir = fs::path(checkpoints_dir) / (name + ".tmp");
  fs::create_directories(checkpoints_dir);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  json files = json::object();
  auto write_tensors = [&](const std::string& file, const NamedTensors& tensors) {
    if (tensors.empty()) return;
    const std::string path = (tmp_dir / file).string();
    data::write_safetensors(path, tensors, {{"format", "pt"}, {"flowtrain_checkpoint", name}});
    FileDigest d = digest_file(path);
    files[file] = {{"bytes", d.bytes}, {"crc32", d.crc32}, {"rank", 0}};
  };
  write_tensors("model.safetensors", c.model);
  maybe_pause_for_fault_injection(c.progress.step);
  write_tensors("ema.safetensors", c.ema);
  write_tensors("optimizer.safetensors", c.optimizer);
  write_tensors("rng.safetensors", c.rng);

  json manifest = {
      {"format", kFormat},
      {"version", kVersion},
      {"flowtrain_version", FLOWTRAIN_VERSION},
      {"step", c.progress.step},
      {"samples_seen", c.progress.samples_seen},
      {"lr", c.progress.lr},
      {"optimizer", {{"type", "adamw"}, {"step_count", c.optimizer_step_count}}},
      {"data", {{"ranks", json::array({json{{"rank", 0}, {"state", state_json(c.progress.loader)}}})}}},
      {"rng", {{"scheme", "per-step generators seeded from (run.seed, rank, step, micro-batch)"}}},
      {"layout", {{"world_size", 1}, {"sharding", "none"}}},
      {"config_yaml", c.config_yaml},
      {"files", files},
  };
  write_file_atomic((tmp_dir / "manifest.json").string(), manifest.dump(2));
  fsync_directory(tmp_dir.string());

  // Commit: an older directory of the same step (a rerun after resume) is replaced.
  if (fs::exists(final_dir)) fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  fsync_directory(checkpoints_dir);
  return final_dir.string();
}

std::string verify_checkpoint(const std::string& dir) {
  try {
    verify_files(dir, read_manifest(dir));
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

CheckpointContents load_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) throw CheckpointError(fmt::format("{}: no such checkpoint directory", dir));
  const json manifest = read_manifest(dir);
  verify_files(dir, manifest);
  const std::string mpath = (fs::path(dir) / "manifest.json").string();

  CheckpointContents c;
  auto read_if = [&](const std::string& file) -> NamedTensors {
    const fs::path path = fs::path(dir) / file;
    if (!manifest["files"].contains(file)) return {};
    try {
      return data::read_safetensors(path.string());
    } catch (const std::exception& e) {
      throw CheckpointError(e.what());
    }
  };
  c.model = read_if("model.safetensors");
  if (c.model.empty()) throw CheckpointError(fmt::format("{}: lists no model.safetensors", mpath));
  c.ema = read_if("ema.safetensors");
  c.optimizer = read_if("optimizer.safetensors");
  c.rng = read_if("rng.safetensors");
  c.progress.step = required<int64_t>(manifest, "step", mpath);
  c.progress.samples_seen = required<int64_t>(manifest, "samples_seen", mpath);
  c.progress.lr = required<double>(manifest, "lr", mpath);
  c.optimizer_step_count = required<json>(manifest, "optimizer", mpath).value("step_count", int64_t{0});
  const json ranks = required<json>(manifest, "data", mpath).value("ranks", json::array());
  if (ranks.empty()) throw CheckpointError(fmt::format("{}: no data-loader state", mpath));
  c.progress.loader.epoch = ranks[0]["state"].value("epoch", int64_t{0});
  c.progress.loader.position = ranks[0]["state"].value("position", int64_t{0});
  c.config_yaml = required<std::string>(manifest, "config_yaml", mpath);
  return c;
}

std::optional<std::string> find_latest_checkpoint(const std::string& checkpoints_dir,
                                                  const std::function<void(const std::string&)>& warn) {
  if (!fs::is_directory(checkpoints_dir)) return std::nullopt;
  std::vector<std::pair<int64_t, std::string>> found;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    if (!entry.is_directory()) continue;
    if (auto step = parse_step_dir(entry.path().filename().string())) found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  for (const auto& [step, path] : found) {
    std::string problem = verify_checkpoint(path);
    if (problem.empty()) return path;
    if (warn) warn(fmt::format("skipping checkpoint {}: {}", path, problem));
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep) {
  if (!fs::is_directory(checkpoints_dir)) return;
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      fs::remove_all(entry.path());  // an interrupted save
      continue;
    }
    if (auto step = parse_step_dir(name)) complete.emplace_back(*step, entry.path());
  }
  if (keep <= 0 || static_cast<int64_t>(complete.size()) <= keep) return;
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + keep < complete.size(); ++i) fs::remove_all(complete[i].second);
}

}  // namespace flowtrain::trainer
