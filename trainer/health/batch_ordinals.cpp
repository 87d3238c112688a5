#include "trainer/health/batch_ordinals.h"

#include "trainer/config/config.h"

#include <charconv>

namespace flowtrain::trainer {

namespace {

bool parse_ordinal(const std::string& text, int64_t& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && out >= 1;
}

}  // namespace

std::set<int64_t> parse_batch_ordinals(const std::vector<std::string>& items, const std::string& key) {
  constexpr int64_t kMaxRange = 1000000;
  std::set<int64_t> out;
  for (const std::string& item : items) {
    const auto dash = item.find('-');
    int64_t first = 0, last = 0;
    const bool ok = dash == std::string::npos
                        ? parse_ordinal(item, first) && parse_ordinal(item, last)
                        : parse_ordinal(item.substr(0, dash), first) && parse_ordinal(item.substr(dash + 1), last);
    if (!ok || last < first)
      throw ConfigError("'" + key + "' items must be batch ordinals >= 1 ('N') or ranges ('A-B', A <= B), got '" +
                        item + "'");
    if (last - first >= kMaxRange)
      throw ConfigError("'" + key + "' range '" + item + "' spans more than " + std::to_string(kMaxRange) + " batches");
    for (int64_t b = first; b <= last; ++b) out.insert(b);
  }
  return out;
}

}  // namespace flowtrain::trainer
