#include "data/shards/shard_inspect.h"

#include "data/data_error.h"
#include "data/shards/brace_expand.h"
#include "data/shards/webdataset.h"

#include <fmt/format.h>

#include <map>

namespace flowtrain::data {

int inspect_shards(const std::vector<std::string>& patterns, std::FILE* out, bool summary_only) {
  int damaged_shards = 0;
  for (const auto& pattern : patterns) {
    for (const auto& entry : expand_braces(pattern)) {
      int64_t samples = 0, damaged = 0;
      uint64_t bytes = 0;
      std::map<std::string, int64_t> by_extension;
      std::string shard_damage;
      try {
        SampleReader reader(open_shard(entry));
        while (auto s = reader.next()) {
          ++samples;
          std::string line = s->key + " ";
          for (const auto& [ext, data] : s->members) {
            line += fmt::format(" {} {} B,", ext, data.size());
            bytes += data.size();
            ++by_extension[ext];
          }
          if (!line.empty() && line.back() == ',') line.pop_back();
          if (!s->error.empty()) {
            ++damaged;
            line += "  DAMAGED: " + s->error;
          }
          if (!summary_only) std::fprintf(out, "%s\n", line.c_str());
        }
      } catch (const DataError& e) {
        shard_damage = e.what();
      }
      std::string members;
      for (const auto& [ext, n] : by_extension) members += fmt::format("{}{} .{}", members.empty() ? "" : ", ", n, ext);
      std::fprintf(out, "%s: %lld samples (%s), %llu bytes of members%s\n", entry.c_str(),
                   static_cast<long long>(samples), members.c_str(), static_cast<unsigned long long>(bytes),
                   damaged ? fmt::format(", {} damaged", damaged).c_str() : "");
      if (!shard_damage.empty()) std::fprintf(out, "  DAMAGED SHARD: %s\n", shard_damage.c_str());
      if (damaged || !shard_damage.empty()) ++damaged_shards;
    }
  }
  return damaged_shards;
}

}  // namespace flowtrain::data
