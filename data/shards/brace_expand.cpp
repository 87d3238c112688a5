#include "data/shards/brace_expand.h"

#include "data/data_error.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

namespace flowtrain::data {
namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The alternatives of one group's body: "a,b,c" or "000..015".
std::vector<std::string> group_alternatives(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string lo = body.substr(0, dots), hi = body.substr(dots + 2);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 18 || hi.size() > 18)
      throw DataError(fmt::format("shard pattern '{}': range {{{}}} must be two non-negative integers", pattern, body));
    const int64_t a = std::stoll(lo), b = std::stoll(hi);
    if (a > b) throw DataError(fmt::format("shard pattern '{}': range {{{}}} is descending", pattern, body));
    const bool padded = (lo.size() > 1 && lo[0] == '0') || (hi.size() > 1 && hi[0] == '0');
    const size_t width = padded ? std::max(lo.size(), hi.size()) : 0;
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(b - a + 1));
    for (int64_t v = a; v <= b; ++v) out.push_back(fmt::format("{:0{}}", v, width));
    return out;
  }
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = body.find(',', start);
    out.push_back(body.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.size() == 1 && out[0].empty())
    throw DataError(fmt::format("shard pattern '{}': empty {{}} group", pattern));
  return out;
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern, size_t max_results) {
  std::vector<std::string> results{""};
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '}') throw DataError(fmt::format("shard pattern '{}': '}}' at {} closes no group", pattern, i));
    if (c != '{') {
      const size_t next = pattern.find_first_of("{}", i);
      const std::string literal = pattern.substr(i, next == std::string::npos ? std::string::npos : next - i);
      for (auto& r : results) r += literal;
      i = next == std::string::npos ? pattern.size() : next;
      continue;
    }
    const size_t close = pattern.find_first_of("{}", i + 1);
    if (close == std::string::npos || pattern[close] != '}')
      throw DataError(fmt::format("shard pattern '{}': '{{' at {} is not closed (groups do not nest)", pattern, i));
    const auto alternatives = group_alternatives(pattern.substr(i + 1, close - i - 1), pattern);
    if (results.size() * alternatives.size() > max_results)
      throw DataError(fmt::format("shard pattern '{}' expands to more than {} names", pattern, max_results));
    std::vector<std::string> expanded;
    expanded.reserve(results.size() * alternatives.size());
    for (const auto& r : results)
      for (const auto& a : alternatives) expanded.push_back(r + a);
    results = std::move(expanded);
    i = close + 1;
  }
  return results;
}

}  // namespace flowtrain::data
