#include "trainer/health/detectors.h"

#include <algorithm>
#include <cmath>

namespace flowtrain::trainer {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

LossSpikeDetector::LossSpikeDetector(int64_t window, double threshold, double ratio, int64_t warmup_steps)
    : capacity_(window), warmup_(warmup_steps), threshold_(threshold), ratio_(ratio) {}

LossSpikeDetector::Verdict LossSpikeDetector::observe(int64_t step, double loss) {
  Verdict v;
  if (!std::isfinite(loss)) return v;  // the non-finite check owns those
  const auto needed = static_cast<size_t>(std::min<int64_t>(capacity_, 20));
  if (step > warmup_ && window_.size() >= needed) {
    const std::vector<double> values(window_.begin(), window_.end());
    v.median = median_of(values);
    std::vector<double> deviations;
    deviations.reserve(values.size());
    for (double x : values) deviations.push_back(std::fabs(x - v.median));
    v.mad = median_of(deviations);
    // 1.4826·MAD estimates the standard deviation of normal data; the floor keeps z finite
    // when the window is constant (the ratio test still guards such a run).
    const double sigma = std::max(1.4826 * v.mad, 1e-12 * std::max(1.0, std::fabs(v.median)));
    v.z = (loss - v.median) / sigma;
    v.spike = v.z > threshold_ && loss >= ratio_ * v.median;
  }
  if (!v.spike) {
    window_.push_back(loss);
    if (static_cast<int64_t>(window_.size()) > capacity_) window_.pop_front();
  }
  return v;
}

GrowthTrend::GrowthTrend(int64_t window_steps, double threshold_mib_per_1k, int64_t warmup_steps)
    : window_(window_steps), threshold_(threshold_mib_per_1k), warmup_(warmup_steps) {}

GrowthTrend::Verdict GrowthTrend::observe(int64_t step, double mib) {
  if (step < warmup_) return {};
  samples_.emplace_back(step, mib);
  while (samples_.size() > 2 && samples_.front().first < step - window_) samples_.pop_front();
  Verdict v;
  v.since_step = samples_.front().first;
  const int64_t span = step - samples_.front().first;
  if (samples_.size() < 3 || 2 * span < window_) return v;
  double mean_x = 0, mean_y = 0;
  for (const auto& [x, y] : samples_) {
    mean_x += double(x);
    mean_y += y;
  }
  mean_x /= double(samples_.size());
  mean_y /= double(samples_.size());
  double sxy = 0, sxx = 0;
  for (const auto& [x, y] : samples_) {
    sxy += (double(x) - mean_x) * (y - mean_y);
    sxx += (double(x) - mean_x) * (double(x) - mean_x);
  }
  v.mib_per_1k_steps = sxx > 0 ? 1000.0 * sxy / sxx : 0;
  if (v.mib_per_1k_steps > threshold_ && step >= quiet_until_) {
    v.growing = true;
    quiet_until_ = step + window_;
  }
  return v;
}

ThroughputWatch::ThroughputWatch(double drop, int64_t patience, int64_t warmup_steps)
    : drop_(drop), patience_(patience), warmup_(warmup_steps) {}

void ThroughputWatch::clear() {
  normal_.clear();
  slow_run_ = 0;
  slow_sum_ = 0;
  reported_ = false;
}

ThroughputWatch::Verdict ThroughputWatch::observe(int64_t first_step, double seconds_per_step) {
  Verdict v;
  if (first_step < warmup_ || !std::isfinite(seconds_per_step)) return v;
  // A median needs a few intervals of normal pace to mean anything.
  const double median = normal_.size() >= 3 ? median_of(normal_) : 0;
  const bool slow = median > 0 && seconds_per_step > (1 + drop_) * median;
  if (!slow) {
    normal_.push_back(seconds_per_step);
    if (normal_.size() > 1000) normal_.erase(normal_.begin());
    slow_run_ = 0;
    slow_sum_ = 0;
    reported_ = false;
    return v;
  }
  if (slow_run_ == 0) slow_since_ = first_step + 1;
  ++slow_run_;
  slow_sum_ += seconds_per_step;
  if (slow_run_ >= patience_ && !reported_) {
    reported_ = true;
    v.cliff = true;
    v.started_at_step = slow_since_;
    v.median_s = median;
    v.recent_s = slow_sum_ / double(slow_run_);
  }
  return v;
}

StragglerReport find_stragglers(const std::vector<RankTimes>& ranks, double ratio) {
  StragglerReport r;
  if (ranks.empty()) return r;
  auto spread = [&](auto get) {
    std::vector<double> v;
    for (const RankTimes& t : ranks) v.push_back(get(t));
    return RankSpread{*std::min_element(v.begin(), v.end()), median_of(v), *std::max_element(v.begin(), v.end())};
  };
  r.step_s = spread([](const RankTimes& t) { return t.step_s; });
  r.data_s = spread([](const RankTimes& t) { return t.data_s; });
  r.comm_s = spread([](const RankTimes& t) { return t.comm_s; });
  r.compute_s = spread([](const RankTimes& t) { return t.compute_s(); });
  const RankSpread busy = spread([](const RankTimes& t) { return t.busy_s(); });
  if (ranks.size() < 2) return r;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankTimes& t = ranks[i];
    if (!(t.busy_s() > ratio * busy.median)) continue;
    Straggler s;
    s.rank = static_cast<int64_t>(i);
    s.busy_s = t.busy_s();
    s.median_busy_s = busy.median;
    // The phase whose excess over the median rank's explains the most of this rank's excess.
    const double data_excess = t.data_s - r.data_s.median, compute_excess = t.compute_s() - r.compute_s.median;
    const bool data = data_excess > compute_excess;
    s.phase = data ? "data loading" : "compute";
    s.phase_s = data ? t.data_s : t.compute_s();
    s.median_phase_s = data ? r.data_s.median : r.compute_s.median;
    r.stragglers.push_back(s);
  }
  std::sort(r.stragglers.begin(), r.stragglers.end(),
            [](const Straggler& a, const Straggler& b) { return a.busy_s > b.busy_s; });
  return r;
}

std::string describe_nonfinite_gradients(const std::vector<std::string>& nonfinite, size_t total) {
  if (nonfinite.empty()) return "";
  const std::string in = " in " + std::to_string(nonfinite.size()) + " of " + std::to_string(total) + " parameters";
  if (nonfinite.size() == 1) return "non-finite gradient" + in + ": " + nonfinite[0];
  return "non-finite gradients" + in + "; the last in forward order, nearest where backward went non-finite: " +
         nonfinite.back() + " (the first: " + nonfinite.front() + ")";
}

}  // namespace flowtrain::trainer
