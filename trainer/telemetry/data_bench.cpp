#include "trainer/telemetry/data_bench.h"

#include "data/shards/shard_loader.h"
#include "trainer/builders.h"
#include "trainer/data_source.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

namespace flowtrain::trainer {

std::string DataBenchReport::to_json() const {
  return nlohmann::json{{"source", source},
                        {"workers", workers},
                        {"batch", batch},
                        {"batches", batches},
                        {"seconds", seconds},
                        {"samples_per_s", samples_per_s},
                        {"member_mb_per_s", member_mb_per_s},
                        {"batch_ms_p50", batch_ms_p50},
                        {"batch_ms_p90", batch_ms_p90}}
      .dump();
}

std::string DataBenchReport::to_table() const {
  return fmt::format(
      "data bench: {}\n  workers {} | batch {} | {} batches in {:.2f} s\n  {:.0f} samples/s | {:.1f} MB/s of "
      "members | next() p50 {:.2f} ms, p90 {:.2f} ms",
      source, workers, batch, batches, seconds, samples_per_s, member_mb_per_s, batch_ms_p50, batch_ms_p90);
}

DataBenchReport run_data_bench(const Config& c, int64_t batches, int64_t warmup) {
  if (batches < 1) throw ConfigError("--steps must be >= 1");
  const auto dataset = build_dataset(c);
  const auto source = make_batch_source(c, dataset, 0, 1, c10::Device(c10::kCPU), {});
  const auto* shards = dynamic_cast<const data::ShardLoader*>(source.get());
  using Clock = std::chrono::steady_clock;
  for (int64_t i = 0; i < warmup; ++i) source->next();
  const int64_t bytes_before = shards ? shards->member_bytes_read() : 0;
  std::vector<double> per_batch;
  const auto t0 = Clock::now();
  int64_t samples = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const auto b0 = Clock::now();
    const data::Batch batch = source->next();
    per_batch.push_back(std::chrono::duration<double, std::milli>(Clock::now() - b0).count());
    samples += batch.labels.size(0);
  }
  DataBenchReport r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.source = c.data.source == DataSource::shards && !c.data.shards.empty() ? "shards " + c.data.shards[0]
                                                                            : name_of(c.data.source);
  r.workers = c.data.workers;
  r.batch = c.data.batch_size;
  r.batches = batches;
  r.samples_per_s = static_cast<double>(samples) / r.seconds;
  // Bytes read over the timed window; the workers also read ahead up to data.prefetch batches,
  // which over many batches is a small, constant offset.
  if (shards) r.member_mb_per_s = static_cast<double>(shards->member_bytes_read() - bytes_before) / 1e6 / r.seconds;
  std::sort(per_batch.begin(), per_batch.end());
  r.batch_ms_p50 = per_batch[per_batch.size() / 2];
  r.batch_ms_p90 = per_batch[std::min(per_batch.size() - 1, per_batch.size() * 9 / 10)];
  return r;
}

}  // namespace flowtrain::trainer
