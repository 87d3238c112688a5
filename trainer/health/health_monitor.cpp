#include "trainer/health/health_monitor.h"

#include "trainer/checkpoint/file_util.h"
#include "trainer/telemetry/memory_stats.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace flowtrain::trainer {

namespace {

constexpr double kMiB = 1048576.0;

std::vector<double> to_doubles(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU, at::kDouble).contiguous().view(-1);
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

void append_health_event(const std::string& out_dir, int64_t rank, int64_t step, const std::string& kind,
                         const std::string& message) {
  const fs::path dir = fs::path(out_dir) / "health";
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::ofstream out(dir / "events.jsonl", std::ios::app);
  out << nlohmann::json{{"step", step}, {"rank", rank}, {"kind", kind}, {"message", message}}.dump() << "\n";
}

HealthMonitor::HealthMonitor(const HealthConfig& config, Wiring wiring)
    : c_(config),
      w_(std::move(wiring)),
      spikes_(config.spike_window, config.spike_threshold, config.spike_ratio, config.warmup_steps),
      memory_(config.memory_window, config.memory_growth_mib_per_1k, config.warmup_steps),
      throughput_(config.throughput_drop, config.throughput_patience, config.warmup_steps) {
  pending_finite_ = at::ones({}, at::TensorOptions().dtype(at::kBool).device(w_.device));
}

StepVerdict HealthMonitor::observe(StepObservation obs) {
  if (w_.judge_every_step) {
    // One small copy: the loss and the norm (the step's stop vote was read with them).
    const std::vector<double> v = to_doubles(at::stack({obs.loss.to(at::kFloat), obs.grad_norm.to(at::kFloat)}));
    return judge(obs, v[0], v[1], /*may_act=*/true);
  }
  pending_finite_.logical_and_(at::isfinite(obs.loss).logical_and(at::isfinite(obs.grad_norm)));
  pending_.push_back(std::move(obs));
  return {};
}

StepVerdict HealthMonitor::judge_pending() {
  if (pending_.empty()) return {};
  std::vector<at::Tensor> losses;
  for (const auto& o : pending_) losses.push_back(o.loss.to(at::kFloat));
  const std::vector<double> loss = to_doubles(at::stack(losses));  // the one read of the interval
  StepVerdict verdict;
  const bool all_finite = pending_finite_.item<bool>();
  for (size_t i = 0; i < pending_.size() && verdict.action == HealthAction::Continue; ++i) {
    // The norm is only read for a step the flag says went wrong somewhere.
    const double norm = all_finite ? 0.0 : pending_[i].grad_norm.item<double>();
    verdict = judge(pending_[i], loss[i], norm, /*may_act=*/false);
  }
  pending_.clear();
  pending_finite_.fill_(true);
  return verdict;
}

StepVerdict HealthMonitor::judge(const StepObservation& obs, double loss, double grad_norm, bool may_act) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    const std::string what = describe_nonfinite(obs, loss);
    const HealthAction wanted = c_.nonfinite == NonfinitePolicy::skip       ? HealthAction::Skip
                                : c_.nonfinite == NonfinitePolicy::rollback ? HealthAction::Rollback
                                                                            : HealthAction::Stop;
    return act(wanted, what, obs.step, may_act);
  }
  if (c_.spike == SpikePolicy::off) return {};
  const LossSpikeDetector::Verdict v = spikes_.observe(obs.step, loss);
  if (!v.spike) return {};
  write_spike_samples(obs, loss, v);
  const std::string what = fmt::format(
      "loss spike at step {} (batch #{}): loss {:.4g} is {:.1f}× the median {:.4g} of the last {} steps (robust z "
      "{:.1f} > {}); per-sample losses in {}/health/spike-step-{:07d}-rank-*.json",
      obs.step, obs.batch_ordinal, loss, loss / v.median, v.median, c_.spike_window, v.z, c_.spike_threshold,
      w_.out_dir, obs.step);
  if (c_.spike == SpikePolicy::warn) {
    if (w_.rank == 0) {
      spdlog::warn("health: {} — training goes on (health.spike: warn)", what);
      append_health_event(w_.out_dir, w_.rank, obs.step, "loss_spike", what);
    }
    return {};
  }
  return act(c_.spike == SpikePolicy::skip ? HealthAction::Skip : HealthAction::Rollback, what, obs.step, may_act);
}

StepVerdict HealthMonitor::act(HealthAction wanted, const std::string& what, int64_t step, bool may_act) {
  StepVerdict v;
  v.reason = what;
  std::string outcome;
  if (wanted == HealthAction::Skip && may_act && skipped_ < c_.max_skips) {
    ++skipped_;
    v.action = HealthAction::Skip;
    outcome = fmt::format("the update is skipped ({} of health.max_skips {})", skipped_, c_.max_skips);
  } else if (wanted == HealthAction::Rollback && may_act) {
    v.action = HealthAction::Rollback;
    outcome = "rolling back to the last checkpoint and continuing past this batch";
  } else {
    v.action = HealthAction::Stop;
    outcome = wanted == HealthAction::Skip && may_act ? fmt::format("stopping: health.max_skips ({}) updates already skipped",
                                                        c_.max_skips)
                                          : "stopping without saving; the last checkpoint is intact";
  }
  // The event is named by the policy asked for (its config word), the outcome says what was done.
  const char* policy = wanted == HealthAction::Skip ? "skip" : wanted == HealthAction::Rollback ? "rollback" : "stop";
  if (w_.rank == 0) append_health_event(w_.out_dir, w_.rank, step, policy, what + " — " + outcome);
  const std::string line = "health: " + what + " — " + outcome;
  // A stop is reported once, by the error that ends the run (flowtrain train prints it).
  if (v.action != HealthAction::Stop && w_.rank == 0) spdlog::warn("{}", line);
  v.reason = line;
  return v;
}

std::string HealthMonitor::describe_nonfinite(const StepObservation& obs, double loss) {
  // Which ranks' own values went bad (before any reduction mixed them), and which parameter.
  std::vector<double> mine = to_doubles(obs.local_flags);
  std::vector<std::vector<double>> all = w_.gather ? w_.gather(mine) : std::vector<std::vector<double>>{mine};
  std::vector<int64_t> loss_ranks, grad_ranks;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] > 0) loss_ranks.push_back(static_cast<int64_t>(r));
    if (all[r][1] > 0) grad_ranks.push_back(static_cast<int64_t>(r));
  }
  std::vector<std::string> params;
  if (w_.nonfinite_params) {
    params = w_.nonfinite_params();
  } else if (obs.param_norms.defined()) {
    const std::vector<double> norms = to_doubles(obs.param_norms);
    for (size_t i = 0; i < norms.size(); ++i)
      if (!std::isfinite(norms[i]))
        params.push_back(i < w_.param_names.size() ? w_.param_names[i] : "#" + std::to_string(i));
  }
  const std::string which = describe_nonfinite_gradients(params, w_.param_names.size());
  std::string where;
  if (!grad_ranks.empty() || !loss_ranks.empty()) {
    const auto& ranks = grad_ranks.empty() ? loss_ranks : grad_ranks;
    where = fmt::format(" on rank{} {}{}", ranks.size() > 1 ? "s" : "", rank_list(ranks),
                        w_.world > 1 && ranks.size() == 1 ? " (" + w_.hosts[ranks[0]] + ")" : "");
  }
  return fmt::format("non-finite {} at step {} (batch #{}){}: the loss {} ({}), the gradient norm is non-finite{}",
                     std::isfinite(loss) ? "gradient" : "loss and gradient", obs.step, obs.batch_ordinal, where,
                     std::isfinite(loss) ? "is finite" : "itself is non-finite", fmt::format("{:.4g}", loss),
                     which.empty() ? "" : "; " + which);
}

void HealthMonitor::write_spike_samples(const StepObservation& obs, double loss, const LossSpikeDetector::Verdict& v) {
  const std::vector<double> per = obs.sample_losses.defined() ? to_doubles(obs.sample_losses) : std::vector<double>{};
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < per.size(); ++i) {
    nlohmann::json row = {{"row", i}, {"loss", std::isfinite(per[i]) ? nlohmann::json(per[i]) : nlohmann::json("nan")}};
    if (i < obs.sample_keys.size()) row["key"] = obs.sample_keys[i];
    rows.push_back(row);
  }
  const nlohmann::json j = {{"step", obs.step}, {"batch", obs.batch_ordinal}, {"rank", w_.rank}, {"loss", loss},
                            {"window_median", v.median}, {"window_mad", v.mad}, {"robust_z", v.z},
                            {"samples", rows}};
  const fs::path dir = fs::path(w_.out_dir) / "health";
  std::error_code ec;
  fs::create_directories(dir, ec);
  write_file_atomic((dir / fmt::format("spike-step-{:07d}-rank-{:05d}.json", obs.step, w_.rank)).string(), j.dump(1));
}

std::map<std::string, double> HealthMonitor::on_interval(const IntervalTimes& t) {
  const MemoryNow mem = memory_now(w_.device);
  const std::vector<double> mine = {t.step_s, t.data_s, t.comm_s, mem.rss_bytes / kMiB, mem.allocated_bytes / kMiB,
                                    mem.reserved_bytes / kMiB};
  const std::vector<std::vector<double>> all = w_.gather ? w_.gather(mine) : std::vector<std::vector<double>>{mine};
  std::map<std::string, double> values;
  // Memory: each rank fits its own trend (a leak is often on one rank) and says so itself.
  const GrowthTrend::Verdict growth = memory_.observe(t.last_step, mem.rss_bytes / kMiB);
  if (growth.growing) {
    const std::string what = fmt::format(
        "resident memory on rank {} grows {:.0f} MiB per 1k steps (least squares over steps {}–{}; now {:.0f} MiB, "
        "threshold health.memory_growth_mib_per_1k {:.0f})",
        w_.rank, growth.mib_per_1k_steps, growth.since_step, t.last_step, mem.rss_bytes / kMiB,
        c_.memory_growth_mib_per_1k);
    spdlog::warn("health: {}", what);
    append_health_event(w_.out_dir, w_.rank, t.last_step, "memory_growth", what);
  }
  values["rss_mib"] = mem.rss_bytes / kMiB;
  values["rss_growth_mib_per_1k"] = growth.mib_per_1k_steps;
  if (w_.device.is_cuda()) {
    values["cuda_allocated_mib"] = mem.allocated_bytes / kMiB;
    values["cuda_reserved_mib"] = mem.reserved_bytes / kMiB;
  }
  if (w_.rank != 0) return values;

  double rss_max = 0;
  for (const auto& r : all) rss_max = std::max(rss_max, r[3]);
  values["rss_mib_max_rank"] = rss_max;
  if (all.size() > 1) {
    std::vector<RankTimes> ranks;
    for (const auto& r : all) ranks.push_back({r[0], r[1], r[2]});
    const StragglerReport report = find_stragglers(ranks, c_.straggler_ratio);
    auto spread = [&](const std::string& name, const RankSpread& s) {
      values[name + "_min"] = s.min;
      values[name + "_median"] = s.median;
      values[name + "_max"] = s.max;
    };
    spread("rank_step_time_s", report.step_s);
    spread("rank_data_wait_s", report.data_s);
    spread("rank_comm_wait_s", report.comm_s);
    spread("rank_compute_s", report.compute_s);
    for (const Straggler& s : report.stragglers) {
      const std::string what = fmt::format(
          "straggler over steps {}–{}: rank {} ({}) is busy {:.3f} s per step against the median rank's {:.3f} s "
          "({:.1f}×, health.straggler_ratio {}); slow phase: {} ({:.3f} s against {:.3f} s); the other ranks wait "
          "for it in collectives",
          t.first_step + 1, t.last_step, s.rank, s.rank < static_cast<int64_t>(w_.hosts.size()) ? w_.hosts[s.rank] : "?",
          s.busy_s, s.median_busy_s, s.busy_s / s.median_busy_s, c_.straggler_ratio, s.phase, s.phase_s,
          s.median_phase_s);
      spdlog::warn("health: {}", what);
      append_health_event(w_.out_dir, w_.rank, t.last_step, "straggler", what);
    }
    values["stragglers"] = double(report.stragglers.size());
  }
  const ThroughputWatch::Verdict cliff = throughput_.observe(t.first_step, t.step_s);
  if (cliff.cliff) {
    const std::string what = fmt::format(
        "throughput drop: {:.3f} s per step since step {} against the run's median {:.3f} s ({:+.0f}%, "
        "{} log intervals in a row); just before: {}",
        cliff.recent_s, cliff.started_at_step, cliff.median_s, 100 * (cliff.recent_s / cliff.median_s - 1),
        c_.throughput_patience, event_before(cliff.started_at_step));
    spdlog::warn("health: {}", what);
    append_health_event(w_.out_dir, w_.rank, t.last_step, "throughput_drop", what);
  }
  return values;
}

void HealthMonitor::record_event(int64_t step, const std::string& what) {
  events_.emplace_back(step, what);
  if (events_.size() > 256) events_.erase(events_.begin());
}

std::string HealthMonitor::event_before(int64_t step) const {
  for (auto it = events_.rbegin(); it != events_.rend(); ++it)
    if (it->first < step) return fmt::format("{} at step {}", it->second, it->first);
  return "nothing recorded (no grid, eval, checkpoint or epoch boundary since the start)";
}

void HealthMonitor::after_rollback(int64_t step) {
  spikes_.clear();
  throughput_.clear();
  memory_.clear();
  pending_.clear();
  pending_finite_.fill_(true);
  record_event(step, "rollback");
}

}  // namespace flowtrain::trainer
