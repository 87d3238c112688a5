// The health detectors' arithmetic, free of the trainer: each takes plain numbers and returns a
// verdict, so each is tested on made-up series (tests/unit/test_health_detectors.cpp) and the
// monitor (health_monitor.h) only wires them to the run. docs/health.md defines them.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// The median of `values` (copied; empty → 0).
double median_of(std::vector<double> values);

// Loss spikes: a step's loss against the median and MAD (median absolute deviation) of the
// last `window` accepted losses. A spike is z = (loss − median) / (1.4826·MAD) above
// `threshold` *and* loss ≥ `ratio` × median: the z-score alone flags harmless wobbles once the
// loss has flattened (a tiny MAD), the ratio alone misses spikes early on. Spikes and
// non-finite losses never enter the window, so one spike does not raise the bar for the next.
class LossSpikeDetector {
 public:
  struct Verdict {
    bool spike = false;
    double median = 0, mad = 0, z = 0;
  };
  LossSpikeDetector(int64_t window, double threshold, double ratio, int64_t warmup_steps);
  // Judges `loss` of `step`; no verdict before warmup_steps or with fewer than min(window, 20)
  // losses seen.
  Verdict observe(int64_t step, double loss);
  void clear() { window_.clear(); }

 private:
  int64_t capacity_, warmup_;
  double threshold_, ratio_;
  std::deque<double> window_;
};

// Resident-memory growth: the least-squares slope of (step, MiB) samples over the last
// `window_steps`, in MiB per 1,000 steps. Samples before `warmup_steps` are not fitted (start-up
// allocation is not a leak). Warns when the slope exceeds the threshold once the samples span at
// least half the window, then stays quiet for a window before it warns again.
class GrowthTrend {
 public:
  struct Verdict {
    bool growing = false;
    double mib_per_1k_steps = 0;
    int64_t since_step = 0;  // the first sample of the fit
  };
  GrowthTrend(int64_t window_steps, double threshold_mib_per_1k, int64_t warmup_steps);
  Verdict observe(int64_t step, double mib);
  void clear() { samples_.clear(); }

 private:
  int64_t window_;
  double threshold_;
  int64_t warmup_;
  int64_t quiet_until_ = 0;
  std::deque<std::pair<int64_t, double>> samples_;
};

// Throughput cliffs: each log interval's seconds per step against the median of the run's
// intervals so far (after warm-up). `patience` intervals in a row more than `drop` above it is a
// cliff, reported once with the step it started at; an interval back at normal re-arms it.
// Slow intervals do not enter the median, so a lasting cliff never becomes the new normal.
class ThroughputWatch {
 public:
  struct Verdict {
    bool cliff = false;
    int64_t started_at_step = 0;  // the first step of the first slow interval
    double median_s = 0, recent_s = 0;
  };
  ThroughputWatch(double drop, int64_t patience, int64_t warmup_steps);
  // The interval of steps after `first_step` (to the next log step) at `seconds_per_step`.
  Verdict observe(int64_t first_step, double seconds_per_step);
  void clear();

 private:
  double drop_;
  int64_t patience_, warmup_;
  std::vector<double> normal_;
  int64_t slow_run_ = 0, slow_since_ = 0;
  double slow_sum_ = 0;
  bool reported_ = false;
};

// Stragglers: one log interval's per-rank means of seconds per step split into data wait,
// collective wait and compute (the rest). In synchronous training every rank's step takes as
// long as the slowest one's — the others wait in collectives — so a straggler is found by its
// *busy* time (data + compute), not its step time.
struct RankTimes {
  double step_s = 0, data_s = 0, comm_s = 0;
  double busy_s() const { return step_s - comm_s; }
  double compute_s() const { return step_s - comm_s - data_s; }
};
struct Straggler {
  int64_t rank = 0;
  double busy_s = 0, median_busy_s = 0;
  std::string phase;              // "data loading" | "compute"
  double phase_s = 0, median_phase_s = 0;
};
struct RankSpread {
  double min = 0, median = 0, max = 0;
};
struct StragglerReport {
  std::vector<Straggler> stragglers;  // ranks busier than ratio × the median, slowest first
  RankSpread step_s, data_s, comm_s, compute_s;
};
StragglerReport find_stragglers(const std::vector<RankTimes>& ranks, double ratio);

// Which parameters' gradients are non-finite, said so that it points at the fault. Backward runs
// from the loss to the input, and a NaN or inf made in it spreads to every gradient computed
// after it, i.e. to every parameter *before* it in forward order. So the last non-finite
// parameter in forward order is the nearest to where backward went non-finite (the fault is in
// it or between it and the next parameter); the first is usually the input embedding, whatever
// went wrong. `nonfinite` lists the affected names in forward order, `total` counts all
// parameters. "" when none.
std::string describe_nonfinite_gradients(const std::vector<std::string>& nonfinite, size_t total);

}  // namespace flowtrain::trainer
