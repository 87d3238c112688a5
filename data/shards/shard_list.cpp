#include "data/shards/shard_list.h"

#include "data/data_error.h"
#include "data/shards/brace_expand.h"
#include "data/shards/byte_stream.h"
#include "data/shards/s3.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace flowtrain::data {

std::string shard_basename(const std::string& entry) {
  std::string s = entry;
  if (s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0) s = s.substr(0, s.find_first_of("?#"));
  if (s.rfind("pipe:", 0) == 0) {
    // `pipe:aws s3 cp s3://bucket/key -`: the object is the last argument containing '/'.
    std::string best;
    size_t start = 5;
    while (start < s.size()) {
      const size_t end = s.find(' ', start);
      const std::string word = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (word.find('/') != std::string::npos) best = word;
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return best.empty() ? s : best.substr(best.find_last_of('/') + 1);
  }
  const size_t slash = s.find_last_of('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

std::vector<std::string> resolve_shard_list(const std::vector<std::string>& patterns, const std::string& list_file) {
  std::vector<std::string> entries;
  for (const auto& pattern : patterns) {
    if (pattern.empty()) throw DataError("data.shards: an empty pattern");
    for (auto& e : expand_braces(pattern)) {
      if (!has_wildcard(e)) {
        entries.push_back(std::move(e));
        continue;
      }
      for (auto& object : expand_object_glob(e, FetchOptions{}, process_environment())) entries.push_back(std::move(object));
    }
  }
  if (!list_file.empty()) {
    std::ifstream in(list_file);
    if (!in) throw DataError(fmt::format("data.shard_list: cannot read {}", list_file));
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
      const size_t first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line[first] == '#') continue;
      entries.push_back(line.substr(first));
    }
  }
  if (entries.empty())
    throw DataError("data.source shards: no shards (set data.shards to a pattern, or data.shard_list to a file)");
  std::set<std::string> seen;
  for (const auto& e : entries) {
    if (!seen.insert(e).second) throw DataError(fmt::format("data.shards: shard '{}' is listed twice", e));
    if (is_local_entry(e) && !std::filesystem::is_regular_file(local_path_of(e)))
      throw DataError(fmt::format("data.shards: shard {} does not exist (or is not a file)", e));
  }
  return entries;
}

}  // namespace flowtrain::data
