// The run's outputs besides checkpoints: the human log (console + log.txt, rank-prefixed, via
// spdlog) and the metrics stream (metrics.jsonl, one JSON object per logged step).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

namespace flowtrain::trainer {

// Installs the default spdlog logger: console (stderr) and, if log_file is non-empty, appended
// to log_file. Lines look like "[2026-12-02 13:00:00.123] [rank 0] [info] message".
void setup_logging(const std::string& log_file, int rank = 0);

// metrics.jsonl writer. Opening for a resumed run first drops every line whose step is greater
// than `resume_step` (those steps are about to be recomputed), so the file never holds a step twice.
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, int64_t resume_step);
  // Appends {"step": step, key: value, …} and flushes (a crash loses at most the current line).
  void write(int64_t step, const std::map<std::string, double>& values);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace flowtrain::trainer
