// `flowtrain data inspect SHARD…`: what a shard holds, sample by sample.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace flowtrain::data {

// Writes, per shard, one line per sample ("KEY  png 312 B, cls 1 B, txt 7 B", "  DAMAGED: …"
// for a damaged one) and a summary line (samples, members by extension, bytes); returns the
// number of shards with damage (0: all whole). Entries may be patterns, URLs or pipe: commands.
int inspect_shards(const std::vector<std::string>& patterns, std::FILE* out, bool summary_only = false);

}  // namespace flowtrain::data
