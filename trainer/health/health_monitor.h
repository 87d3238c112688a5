// Training health: watches every step (non-finite values, loss spikes) and every log interval
// (stragglers, memory growth, throughput cliffs), says what went wrong in `health:` lines that
// name the step, rank and tensor, and decides by policy (config `health`) what the loop does.
//
// The per-step checks cost nothing the step does not already compute: the global gradient norm
// (one fused reduction) is non-finite iff some gradient is, and the loss is already reduced.
// Reading them on the host is the one question: a multi-rank step already reads its stop vote
// every step, and on the CPU a read is free, so there every step is judged at once; a single
// GPU with only stop/warn policies keeps the verdicts on the device (the first non-finite step and
// its parameter recorded there) and reads them at log steps and before anything is written.
#pragma once

#include "trainer/config/config.h"
#include "trainer/health/detectors.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// What one step leaves for the monitor, on the device.
struct StepObservation {
  int64_t step = 0;            // the step being taken (1-based)
  int64_t batch_ordinal = 0;   // its batch's place in the data order
  at::Tensor loss, grad_norm;  // global: all-reduced, the same on every rank
  at::Tensor local_flags;      // float [2]: this rank's own loss / gradients were non-finite (before reduction)
  at::Tensor param_norms;      // one process: [P] gradient norm per parameter, forward order
  at::Tensor sample_losses;    // [b] this rank's per-sample losses
  std::vector<std::string> sample_keys;  // shards: the samples' keys, in row order
};

enum class HealthAction { Continue, Skip, Rollback, Stop };

struct StepVerdict {
  HealthAction action = HealthAction::Continue;
  std::string reason;  // the health: line that decided it
};

// One log interval on this rank: mean seconds per step and their split.
struct IntervalTimes {
  int64_t first_step = 0, last_step = 0;  // steps (first, last]
  double step_s = 0, data_s = 0, comm_s = 0;
};

class HealthMonitor {
 public:
  struct Wiring {
    int64_t rank = 0, world = 1;
    std::string out_dir;
    std::vector<std::string> param_names;  // forward order (names param_norms' entries)
    std::vector<std::string> hosts;        // by rank
    c10::Device device = c10::kCPU;
    bool judge_every_step = true;
    // Every rank's `mine` (the same length everywhere), by rank; a world collective.
    std::function<std::vector<std::vector<double>>(const std::vector<double>&)> gather;
    // Multi-rank: the parameters (forward order) whose reduced gradient shard is non-finite on
    // any rank; a world collective. Unset: param_norms name them.
    std::function<std::vector<std::string>()> nonfinite_params;
  };
  HealthMonitor(const HealthConfig& config, Wiring wiring);

  // Judges the step now (every-step mode) or keeps it on the device for judge_pending().
  StepVerdict observe(StepObservation obs);
  // Judges the steps kept on the device (log steps, and before a checkpoint, grid or eval);
  // only Continue or Stop here: their updates have been applied.
  StepVerdict judge_pending();

  // Log interval: gathers every rank's times and memory (a world collective), warns about
  // stragglers, memory growth and throughput cliffs; returns the values for metrics.jsonl.
  std::map<std::string, double> on_interval(const IntervalTimes& times);
  // Events a throughput cliff is explained by: "sample grid", "checkpoint", "eval", "data epoch 3".
  void record_event(int64_t step, const std::string& what);
  // After a rollback: loss history and pending steps are cleared (the run replays from there).
  void after_rollback(int64_t step);

  int64_t skipped_updates() const { return skipped_; }
  void set_skipped_updates(int64_t n) { skipped_ = n; }

 private:
  StepVerdict judge(const StepObservation& obs, double loss, double grad_norm, bool may_act);
  std::string describe_nonfinite(const StepObservation& obs, double loss);
  void write_spike_samples(const StepObservation& obs, double loss, const LossSpikeDetector::Verdict& v);
  // `wanted`: what the policy asks for (Skip, Rollback or Stop); a skip past health.max_skips, or
  // any remedy where the verdict may not act, stops.
  StepVerdict act(HealthAction wanted, const std::string& what, int64_t step, bool may_act);
  std::string event_before(int64_t step) const;

  HealthConfig c_;
  Wiring w_;
  LossSpikeDetector spikes_;
  GrowthTrend memory_;
  ThroughputWatch throughput_;
  std::vector<StepObservation> pending_;
  at::Tensor pending_finite_;  // deferred mode: every kept step was finite (device flag)
  int64_t skipped_ = 0;
  std::vector<std::pair<int64_t, std::string>> events_;
};

// The run's health events as JSON lines, <out_dir>/health/events.jsonl (rank 0 and any rank that
// found something itself).
void append_health_event(const std::string& out_dir, int64_t rank, int64_t step, const std::string& kind,
                         const std::string& message);

}  // namespace flowtrain::trainer
