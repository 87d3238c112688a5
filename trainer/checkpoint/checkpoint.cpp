#include "trainer/checkpoint/checkpoint.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/file_util.h"

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

json state_json(const data::LoaderState& s) { return {{"epoch", s.epoch}, {"position", s.position}}; }

// The in-memory loader's state is global (samples of the epoch consumed by all ranks together);
// each rank's slice of a batch follows from it, so one record serves every rank. Shards add the
// merged state of all ranks.
json data_json(const TrainProgress& p) {
  json j = {{"ranks", json::array({json{{"rank", 0}, {"state", state_json(p.loader)}}})}};
  if (p.shards) {
    const ShardsDataState& s = *p.shards;
    j["shards"] = {{"world", s.world},           {"global_batch", s.global_batch},
                   {"fingerprint", fmt::format("{:016x}", s.fingerprint)},
                   {"epoch", s.epoch},     {"batches_left", s.batches_left},
                   {"stream_counts", s.stream_counts}, {"skipped", s.skipped}, {"repeated", s.repeated},
                   {"keys_written", s.keys_written}, {"pending", s.pending}};
  }
  return j;
}

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

std::string shard_file(const std::string& kind, int64_t index, int64_t count) {
  return fmt::format("{}.shard-{:05d}-of-{:05d}.safetensors", kind, index, count);
}

namespace {

// Writes `tensors` (if any) into dir/file and returns its manifest record in `files`.
void write_tensor_file(const fs::path& dir, const std::string& file, const NamedTensors& tensors,
                       const std::string& checkpoint, int64_t rank, json& files) {
  if (tensors.empty()) return;
  const data::WrittenFile w = data::write_safetensors((dir / file).string(), tensors,
                                                      {{"format", "pt"}, {"flowtrain_checkpoint", checkpoint}});
  files[file] = {{"bytes", w.bytes}, {"crc32", w.crc32}, {"rank", rank}};
}

// Runs one phase of the protocol on this rank and votes on it: the message of a local failure
// is kept for the error; a failure elsewhere is named by the rank that had it (in its own log).
class PhaseVote {
 public:
  PhaseVote(const SaveGroup& group, std::string checkpoint) : group_(group), checkpoint_(std::move(checkpoint)) {}

  void run(const char* phase, const std::function<void()>& work) {
    bool ok = true;
    try {
      work();
    } catch (const std::exception& e) {
      ok = false;
      error_ = fmt::format("checkpoint {}: {} failed on rank {}: {}", checkpoint_, phase, group_.rank, e.what());
    }
    const bool all = group_.all_ok ? group_.all_ok(ok) : ok;
    if (all) return;
    if (error_.empty())
      error_ = fmt::format("checkpoint {}: {} failed on another rank (its log names the cause)", checkpoint_, phase);
    throw CheckpointError(error_);
  }

 private:
  const SaveGroup& group_;
  std::string checkpoint_;
  std::string error_;
};

}  // namespace

std::string save_checkpoint(const std::string& checkpoints_dir, const CheckpointContents& c, const SaveGroup& group) {
  const std::string name = checkpoint_name(c.progress.step);
  const fs::path final_dir = fs::path(checkpoints_dir) / name;
  const fs::path tmp_dir = fs::path(checkpoints_dir) / (name + ".tmp");
  const bool lead = group.rank == 0;
  PhaseVote vote(group, (fs::path(checkpoints_dir) / name).string());
  try {
    vote.run("creating the directory", [&] {  // it exists before anyone writes into it
      if (!lead) return;
      fs::create_directories(checkpoints_dir);
      fs::remove_all(tmp_dir);
      fs::create_directories(tmp_dir);
    });

    json files = json::object();
    vote.run("writing", [&] {  // every shard is on disk
      if (c.sharded) {
        const ShardedContents& sh = *c.sharded;
        const int64_t n = sh.layout.num_shards;
        if (sh.writer) {
          json mine = json::object();
          write_tensor_file(tmp_dir, shard_file("model", sh.shard_index, n), c.model, name, group.rank, mine);
          if (group.after_first_file)
            group.after_first_file(c.progress.step, (tmp_dir / shard_file("model", sh.shard_index, n)).string());
          write_tensor_file(tmp_dir, shard_file("ema", sh.shard_index, n), c.ema, name, group.rank, mine);
          write_tensor_file(tmp_dir, shard_file("optimizer", sh.shard_index, n), c.optimizer, name, group.rank, mine);
          // The digests travel to rank 0 through the (shared) checkpoint directory itself.
          write_file_atomic((tmp_dir / fmt::format("files.shard-{:05d}.json", sh.shard_index)).string(), mine.dump());
        }
        if (lead) write_tensor_file(tmp_dir, "fixed.safetensors", sh.fixed, name, 0, files);
      } else {
        write_tensor_file(tmp_dir, "model.safetensors", c.model, name, 0, files);
        if (group.after_first_file) group.after_first_file(c.progress.step, (tmp_dir / "model.safetensors").string());
        write_tensor_file(tmp_dir, "ema.safetensors", c.ema, name, 0, files);
        write_tensor_file(tmp_dir, "optimizer.safetensors", c.optimizer, name, 0, files);
      }
      if (lead) write_tensor_file(tmp_dir, "rng.safetensors", c.rng, name, 0, files);
      // The same on every rank (the amaxes were reduced over all of them): rank 0 writes it.
      if (lead && !c.fp8.empty()) write_tensor_file(tmp_dir, "fp8.safetensors", c.fp8, name, 0, files);
    });

    vote.run("committing", [&] {  // nobody moves on (or exits) before the checkpoint is committed
      if (!lead) return;
      json layout = {{"world_size", c.world_size}, {"sharding", c.sharded ? "fsdp" : "none"}};
      if (c.sharded) {
        for (int64_t k = 0; k < c.sharded->layout.num_shards; ++k) {
          const fs::path record = tmp_dir / fmt::format("files.shard-{:05d}.json", k);
          if (!fs::exists(record))
            throw CheckpointError(fmt::format("{}: shard {} did not record its files", tmp_dir.string(), k));
          const json recorded = json::parse(read_text_file(record.string()));  // named: items() must not outlive it
          for (const auto& [file, info] : recorded.items()) files[file] = info;
          fs::remove(record);
        }
        layout["fsdp"] = c.sharded->layout.to_json();
      }
      json manifest = {
          {"format", kFormat},
          {"version", kVersion},
          {"flowtrain_version", FLOWTRAIN_VERSION},
          {"step", c.progress.step},
          {"samples_seen", c.progress.samples_seen},
          {"lr", c.progress.lr},
          {"optimizer", {{"type", "adamw"}, {"step_count", c.optimizer_step_count}}},
          // The loader state is global (samples of the epoch consumed by all ranks together);
          // each rank's slice of a batch follows from it, so one record serves every rank.
          {"data", data_json(c.progress)},
          {"health", {{"batches_drawn", c.progress.batches_drawn},
                      {"skip_batches", c.progress.skip_batches},
                      {"skipped_updates", c.progress.skipped_updates}}},
          // Both devices' rule (trainer.cpp draw_step_inputs); the draws need no state beyond them.
          {"rng",
           {{"scheme",
             "cpu: one generator per sample seeded from (run.seed, step, global sample index); cuda: one generator "
             "per data-parallel slice seeded from (run.seed, step, the slice's first global sample index)"}}},
          {"layout", layout},
          {"config_yaml", c.config_yaml},
          {"files", files},
      };
      if (c.frozen_files) {
        json frozen = json::object();
        for (const auto& [key, record] : *c.frozen_files) frozen[key] = {{"path", record.path}, {"content", record.content}};
        manifest["frozen_files"] = frozen;
      }
      write_file_atomic((tmp_dir / "manifest.json").string(), manifest.dump(2));
      fsync_directory(tmp_dir.string());
      // Commit: an older directory of the same step (a rerun after resume) is replaced.
      if (fs::exists(final_dir)) fs::remove_all(final_dir);
      fs::rename(tmp_dir, final_dir);
      fsync_directory(checkpoints_dir);
    });
  } catch (const CheckpointError&) {
    if (lead) {
      std::error_code ignored;
      fs::remove_all(tmp_dir, ignored);  // a partial save never looks complete (no manifest, no rename)
    }
    throw;
  }
  return final_dir.string();
}

json read_checkpoint_manifest(const std::string& dir) { return read_manifest(dir); }

std::string verify_checkpoint(const std::string& dir) {
  try {
    verify_files(dir, read_manifest(dir));
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

namespace {

NamedTensors read_tensors(const fs::path& path) {
  try {
    return data::read_safetensors(path.string());
  } catch (const std::exception& e) {
    throw CheckpointError(e.what());
  }
}

// Everything but the tensors: progress, counters, config, layout.
CheckpointContents read_metadata(const std::string& dir, const json& manifest) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  CheckpointContents c;
  c.progress.step = required<int64_t>(manifest, "step", mpath);
  c.progress.samples_seen = required<int64_t>(manifest, "samples_seen", mpath);
  c.progress.lr = required<double>(manifest, "lr", mpath);
  c.optimizer_step_count = required<json>(manifest, "optimizer", mpath).value("step_count", int64_t{0});
  const json ranks = required<json>(manifest, "data", mpath).value("ranks", json::array());
  if (ranks.empty()) throw CheckpointError(fmt::format("{}: no data-loader state", mpath));
  c.progress.loader.epoch = ranks[0]["state"].value("epoch", int64_t{0});
  c.progress.loader.position = ranks[0]["state"].value("position", int64_t{0});
  const json data = required<json>(manifest, "data", mpath);
  if (data.contains("shards")) {
    try {
      const json& j = data.at("shards");
      ShardsDataState s;
      s.world = j.at("world").get<int64_t>();
      s.global_batch = j.at("global_batch").get<int64_t>();
      s.fingerprint = std::stoull(j.at("fingerprint").get<std::string>(), nullptr, 16);
      s.epoch = j.at("epoch").get<int64_t>();
      s.batches_left = j.at("batches_left").get<int64_t>();
      s.stream_counts = j.at("stream_counts").get<std::vector<int64_t>>();
      s.skipped = j.at("skipped").get<int64_t>();
      s.repeated = j.at("repeated").get<int64_t>();
      s.keys_written = j.at("keys_written").get<std::vector<int64_t>>();
      s.pending = j.value("pending", std::vector<int64_t>{});
      c.progress.shards = s;
    } catch (const json::exception& e) {
      throw CheckpointError(fmt::format("{}: data.shards: {}", mpath, e.what()));
    }
  }
  // Checkpoints from before the health record drew one batch per step and skipped none.
  const json health = manifest.value("health", json::object());
  try {
    c.progress.batches_drawn = health.value("batches_drawn", c.progress.step);
    for (int64_t b : health.value("skip_batches", std::vector<int64_t>{})) c.progress.skip_batches.insert(b);
    c.progress.skipped_updates = health.value("skipped_updates", int64_t{0});
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: health: {}", mpath, e.what()));
  }
  c.config_yaml = required<std::string>(manifest, "config_yaml", mpath);
  if (manifest.contains("frozen_files")) {
    try {
      std::map<std::string, FrozenFileRecord> frozen;
      for (const auto& [key, record] : manifest.at("frozen_files").items())
        frozen[key] = {record.at("path").get<std::string>(), record.at("content").get<std::string>()};
      c.frozen_files = std::move(frozen);
    } catch (const json::exception& e) {
      throw CheckpointError(fmt::format("{}: frozen_files: {}", mpath, e.what()));
    }
  }
  c.world_size = manifest.value("layout", json::object()).value("world_size", int64_t{1});
  if (manifest["files"].contains("rng.safetensors")) c.rng = read_tensors(fs::path(dir) / "rng.safetensors");
  if (manifest["files"].contains("fp8.safetensors")) c.fp8 = read_tensors(fs::path(dir) / "fp8.safetensors");
  return c;
}

std::optional<ShardLayout> sharding_of(const std::string& dir, const json& manifest) {
  const json layout = manifest.value("layout", json::object());
  if (layout.value("sharding", "none") != "fsdp") return std::nullopt;
  return ShardLayout::from_json(layout.value("fsdp", json::object()), (fs::path(dir) / "manifest.json").string());
}

}  // namespace

CheckpointContents load_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) throw CheckpointError(fmt::format("{}: no such checkpoint directory", dir));
  const json manifest = read_manifest(dir);
  verify_files(dir, manifest);
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  CheckpointContents c = read_metadata(dir, manifest);
  const json& files = manifest["files"];
  auto read_if = [&](const std::string& file) -> NamedTensors {
    if (!files.contains(file)) return {};
    return read_tensors(fs::path(dir) / file);
  };
  if (auto layout = sharding_of(dir, manifest)) {
    const int64_t n = layout->num_shards;
    const NamedTensors fixed = read_if("fixed.safetensors");
    auto consolidate = [&](const std::string& kind, const std::vector<std::string>& prefixes) -> NamedTensors {
      if (!files.contains(shard_file(kind, 0, n))) return {};
      std::vector<NamedTensors> shards;
      for (int64_t k = 0; k < n; ++k) {
        const std::string file = shard_file(kind, k, n);
        if (!files.contains(file)) throw CheckpointError(fmt::format("{}: lists no {}", mpath, file));
        shards.push_back(read_tensors(fs::path(dir) / file));
      }
      NamedTensors out;
      for (const auto& prefix : prefixes)
        for (auto& item : consolidate_shards(*layout, shards, fixed, prefix, dir)) out.push_back(std::move(item));
      return out;
    };
    c.model = consolidate("model", {""});
    c.ema = consolidate("ema", {""});
    c.optimizer = consolidate("optimizer", {"exp_avg.", "exp_avg_sq."});
  } else {
    c.model = read_if("model.safetensors");
    c.ema = read_if("ema.safetensors");
    c.optimizer = read_if("optimizer.safetensors");
  }
  if (c.model.empty()) throw CheckpointError(fmt::format("{}: lists no model weights", mpath));
  return c;
}

CheckpointContents load_checkpoint_shard(const std::string& dir, int64_t shard_index) {
  if (!fs::is_directory(dir)) throw CheckpointError(fmt::format("{}: no such checkpoint directory", dir));
  const json manifest = read_manifest(dir);
  verify_files(dir, manifest);
  auto layout = sharding_of(dir, manifest);
  if (!layout) throw CheckpointError(fmt::format("{}: not a sharded checkpoint", dir));
  CheckpointContents c = read_metadata(dir, manifest);
  const json& files = manifest["files"];
  const int64_t n = layout->num_shards;
  auto read_if = [&](const std::string& file) -> NamedTensors {
    if (!files.contains(file)) return {};
    return read_tensors(fs::path(dir) / file);
  };
  c.model = read_if(shard_file("model", shard_index, n));
  if (c.model.empty()) throw CheckpointError(fmt::format("{}: lists no {}", dir, shard_file("model", shard_index, n)));
  c.ema = read_if(shard_file("ema", shard_index, n));
  c.optimizer = read_if(shard_file("optimizer", shard_index, n));
  ShardedContents sh;
  sh.layout = *layout;
  sh.shard_index = shard_index;
  sh.fixed = read_if("fixed.safetensors");
  c.sharded = std::move(sh);
  return c;
}

std::optional<ShardLayout> load_checkpoint_layout(const std::string& dir) {
  return sharding_of(dir, read_manifest(dir));
}

int64_t checkpoint_num_shards(const std::string& dir) {
  const json manifest = read_manifest(dir);
  auto layout = sharding_of(dir, manifest);
  return layout ? layout->num_shards : 1;
}

std::vector<std::pair<int64_t, std::string>> committed_checkpoints(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return found;
  // An existing directory that cannot be read throws: "no checkpoints" would start the run from
  // scratch over its saved work.
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    if (!entry.is_directory()) continue;
    if (auto step = parse_step_dir(entry.path().filename().string())) found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<std::string> find_latest_checkpoint(const std::string& checkpoints_dir,
                                                  const std::function<void(const std::string&)>& warn) {
  std::vector<std::pair<int64_t, std::string>> found = committed_checkpoints(checkpoints_dir);
  std::reverse(found.begin(), found.end());
  for (const auto& [step, path] : found) {
    std::string problem = verify_checkpoint(path);
    if (problem.empty()) return path;
    if (warn) warn(fmt::format("skipping checkpoint {}: {}", path, problem));
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep) {
  if (!fs::is_directory(checkpoints_dir)) return;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) fs::remove_all(entry.path());  // an interrupted save
  }
  const std::vector<std::pair<int64_t, std::string>> complete = committed_checkpoints(checkpoints_dir);
  if (keep <= 0 || static_cast<int64_t>(complete.size()) <= keep) return;
  for (size_t i = 0; i + keep < complete.size(); ++i) fs::remove_all(complete[i].second);
}

}  // namespace flowtrain::trainer
