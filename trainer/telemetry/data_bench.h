// `flowtrain bench --data-only`: how fast the run's loader produces batches when nothing else
// competes for them — the ceiling the training step's data wait is measured against. The
// loader is built exactly as the trainer builds it (trainer/data_source.h), at one rank, with
// the config's data.workers; after `warmup` batches, `batches` are taken back to back.
#pragma once

#include "trainer/config/config.h"

#include <string>

namespace flowtrain::trainer {

struct DataBenchReport {
  std::string source;      // data.source, and for shards the first entry
  int64_t workers = 0, batch = 0, batches = 0;
  double seconds = 0;
  double samples_per_s = 0;
  double member_mb_per_s = 0;  // shards: encoded member bytes read per second (MB = 1e6 B)
  double batch_ms_p50 = 0, batch_ms_p90 = 0;  // time per next() call
  std::string to_json() const;
  std::string to_table() const;
};

DataBenchReport run_data_bench(const Config& config, int64_t batches, int64_t warmup);

}  // namespace flowtrain::trainer
