#include "data/shards/shard_index.h"

#include "data/data_error.h"
#include "data/shards/shard_list.h"
#include "data/shards/webdataset.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <unistd.h>

namespace flowtrain::data {

using nlohmann::json;

void write_shard_index(const std::string& dir, const std::vector<ShardIndexEntry>& shards) {
  json j = {{"format", "flowtrain-shard-index-1"}, {"shards", json::array()}};
  for (const auto& s : shards) j["shards"].push_back({{"name", s.name}, {"samples", s.samples}, {"bytes", s.bytes}});
  // A temporary name of this process's own: ranks that finish together may both write the index.
  const std::string path = dir + "/index.json", tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    if (!out.flush()) throw DataError(fmt::format("{}: write failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw DataError(fmt::format("{}: rename failed", path));
}

std::map<std::string, int64_t> read_shard_index(const std::string& entry, const FetchOptions& options) {
  auto stream = open_shard(entry, options);
  std::string text;
  char buf[1 << 16];
  for (size_t got; (got = stream->read(buf, sizeof buf)) > 0;) text.append(buf, got);
  stream->finish();
  std::map<std::string, int64_t> counts;
  try {
    const json j = json::parse(text);
    if (j.value("format", std::string()) != "flowtrain-shard-index-1")
      throw DataError(fmt::format("shard index {}: format is not flowtrain-shard-index-1", entry));
    for (const auto& s : j.at("shards")) {
      const auto samples = s.at("samples").get<int64_t>();
      if (samples < 0) throw DataError(fmt::format("shard index {}: negative sample count", entry));
      counts[s.at("name").get<std::string>()] = samples;
    }
  } catch (const json::exception& e) {
    throw DataError(fmt::format("shard index {}: {}", entry, e.what()));
  }
  return counts;
}

std::vector<int64_t> shard_sample_counts(const std::vector<std::string>& shards, const std::string& index_entry,
                                         int threads, const FetchOptions& options, int64_t* counted) {
  // An explicit index names shards by base name. Without one, each local shard is looked up in
  // the index.json of its own directory: two packed sets both hold train-000000.tar, and one
  // set's counts must not be taken for the other's.
  std::map<std::string, int64_t> explicit_index;
  if (!index_entry.empty()) explicit_index = read_shard_index(index_entry, options);
  std::map<std::string, std::map<std::string, int64_t>> by_directory;
  std::vector<int64_t> counts(shards.size(), -1);
  std::vector<size_t> unindexed;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::map<std::string, int64_t>* index = &explicit_index;
    if (index_entry.empty()) {
      if (!is_local_entry(shards[i])) {
        unindexed.push_back(i);
        continue;
      }
      const std::string dir = std::filesystem::path(local_path_of(shards[i])).parent_path().string();
      auto it = by_directory.find(dir);
      if (it == by_directory.end()) {
        const auto beside = std::filesystem::path(dir) / "index.json";
        it = by_directory
                 .emplace(dir, std::filesystem::exists(beside) ? read_shard_index(beside.string(), options)
                                                               : std::map<std::string, int64_t>{})
                 .first;
      }
      index = &it->second;
    }
    const auto found = index->find(shard_basename(shards[i]));
    if (found != index->end()) counts[i] = found->second;
    else unindexed.push_back(i);
  }
  if (counted) *counted = static_cast<int64_t>(unindexed.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t k; (k = next++) < unindexed.size();) {
      try {
        std::string damage;  // a damaged shard still has its readable samples; the loader skips the rest
        counts[unindexed[k]] = count_samples(shards[unindexed[k]], options, &damage);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return counts;
}

}  // namespace flowtrain::data
