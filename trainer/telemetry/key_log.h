// data.record_keys: each data-parallel rank appends the keys of the samples it trained on, in
// order, one a line, to <out_dir>/data/keys-rank-RRRRR.txt, so a user can audit what the model
// saw (and tests can check exactly-once). A resumed run first cuts each file back to the lines
// its checkpoint covers, so steps trained after that checkpoint and lost are not listed twice.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace flowtrain::trainer {

std::string key_log_path(const std::string& out_dir, int64_t dp_rank);

// Cuts `path` to its first `lines` lines (0: empties it). A file with fewer lines (lost in a host
// crash) is kept as it is, with a warning; a missing one that should hold lines is an error.
void truncate_key_log(const std::string& path, int64_t lines);

class KeyLog {
 public:
  // Cuts the rank's file to `lines` lines, then appends.
  KeyLog(const std::string& out_dir, int64_t dp_rank, int64_t lines);
  void append(const std::vector<std::string>& keys);  // flushed: a crash loses no written line

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace flowtrain::trainer
