// Shard patterns in brace notation, as WebDataset and the shell write them:
//   /data/cc/train-{000000..004095}.tar      a numeric range; zero-padded to the wider bound when
//                                            either bound has a leading zero (bash's rule)
//   s3-{a,b,c}/part-{0..9}.tar               a list; several groups multiply out, left to right
// Groups do not nest. A pattern without braces is itself.
#pragma once

#include <string>
#include <vector>

namespace flowtrain::data {

// Expands `pattern`; throws DataError naming the pattern on an unbalanced brace, an empty group,
// a descending or non-numeric range, or more than `max_results` results.
std::vector<std::string> expand_braces(const std::string& pattern, size_t max_results = 10'000'000);

}  // namespace flowtrain::data
