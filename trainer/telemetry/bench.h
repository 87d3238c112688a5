// `flowtrain bench`: times the real training step (data loader, forward, backward, clip, AdamW,
// EMA) after a warm-up, and reports what a training engineer compares trainers by: median and
// spread of step time, samples/s, tokens/s, achieved TFLOP/s, MFU and peak memory.
#pragma once

#include "trainer/config/config.h"

#include <optional>
#include <string>
#include <vector>

namespace flowtrain::trainer {

struct BenchOptions {
  int64_t steps = 20;        // timed steps
  int64_t warmup = 3;        // untimed steps first (allocator, caches, thread pools)
  bool synthetic = false;    // data.source = synthetic (no data set needed; loader still runs)
  double peak_tflops = 0;    // the MFU denominator; 0 = measure a large matmul on this device
  std::string parity_dump;   // if set: write the first step's inputs, weights and loss here
  // --checkpoint: the run is done twice, saving every checkpoint_every steps (0 = steps / 3),
  // synchronously and asynchronously, and the report adds what a save costs training.
  bool checkpoint = false;
  int64_t checkpoint_every = 0;
};

// What a save costs training (--checkpoint), rank 0's view. Medians over the saves of each run.
struct CheckpointCost {
  int64_t saves = 0;            // per run
  int64_t every = 0;            // steps between saves
  int64_t bytes = 0;            // one checkpoint on disk, all ranks' files
  double sync_s = 0;            // training blocked by a synchronous save (the whole save)
  double blocked_s = 0;         // training blocked by an asynchronous one (previous save + staging)
  double persist_s = 0;         // its background write + hash + commit
  double step_clear_s = 0;      // async run: median step time of steps no persist overlapped
  double step_overlap_s = 0;    // async run: median step time of the steps that overlapped one
  int64_t overlap_steps = 0;
  int64_t staging_bytes = 0;    // host staging buffers (allocated once)
};

struct BenchReport {
  std::string device, precision;
  int64_t threads = 0, batch = 0, tokens_per_sample = 0, steps = 0, warmup = 0;
  int64_t rank = 0, world = 1;  // a multi-rank bench: every rank reports; batch and rates are the job's
  double params_m = 0, train_gflop_per_sample = 0;
  double step_time_median_s = 0, step_time_p10_s = 0, step_time_p90_s = 0, step_time_min_s = 0, step_time_max_s = 0;
  double data_wait_median_s = 0;
  double encode_median_s = 0;  // the frozen encoders inside the step (online encoding); 0 without
  double samples_per_s = 0, tokens_per_s = 0, achieved_tflops = 0, peak_tflops = 0, mfu = 0;
  std::string peak_source;   // "config" | "measured fp32 matmul" | …
  // Peaks of this rank over the whole run, transients included (trainer/telemetry/memory_stats.h).
  // peak_memory_bytes is the headline: CPU peak RSS, or CUDA max_memory_allocated.
  int64_t peak_memory_bytes = 0;
  std::string memory_kind;   // "cpu peak RSS" | "cuda peak allocated"
  int64_t peak_rss_bytes = 0, peak_allocated_bytes = 0;
  std::string allocated_kind;
  // The tensor peak trainer/memory_estimate.h predicts for this rank (0: the family has no estimate),
  // beside peak_allocated_bytes, its measured counterpart.
  int64_t estimated_peak_bytes = 0;
  // A multi-rank bench: every rank's peak_memory_bytes / peak_allocated_bytes, by rank.
  std::vector<int64_t> peak_memory_bytes_per_rank, peak_allocated_bytes_per_rank;
  double first_loss = 0;
  std::optional<CheckpointCost> checkpoint;  // with --checkpoint (step figures then come from the async run)
  std::string to_json() const;
  std::string to_table() const;

 private:
  std::string table_lines() const;
};

BenchReport run_benchmark(Config config, const BenchOptions& options);

// Achieved TFLOP/s of a large square matmul in `dtype` on `device` (the practical peak).
double measure_matmul_tflops(const c10::Device& device, at::ScalarType dtype);

// The first training step's exact inputs for a parity check against another implementation
// (bench/compare_pytorch.sh): safetensors with the initial weights under their reference names
// ("model.<key>"), "x0" [B,C,H,W] f32, "labels" (after label dropout) i64, "t" f32, "noise" f32
// and "loss" (the flow-matching loss of the first micro-batch, fp32), plus the model shape in
// the metadata. Returns that loss.
double write_parity_dump(const Config& config, const std::string& path);

}  // namespace flowtrain::trainer
