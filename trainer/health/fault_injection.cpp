#include "trainer/health/fault_injection.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <cstring>
#include <limits>
#include <thread>

namespace flowtrain::trainer {

namespace {

void sleep_seconds(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

CheckpointPause parse_checkpoint_pause(const std::string& text) {
  const auto bad = [&] {
    return ConfigError("'debug.inject.checkpoint_pause' must be STEP:SECONDS or STEP:SECONDS:torn (STEP >= 1, "
                       "SECONDS >= 0), got '" + text + "'");
  };
  CheckpointPause pause;
  const size_t first = text.find(':');
  if (first == std::string::npos) throw bad();
  const size_t second = text.find(':', first + 1);
  try {
    size_t used = 0;
    const std::string step = text.substr(0, first);
    pause.step = std::stoll(step, &used);
    if (used != step.size() || pause.step < 1) throw bad();
    const std::string seconds = text.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
    pause.seconds = std::stod(seconds, &used);
    if (used != seconds.size() || !(pause.seconds >= 0) || !std::isfinite(pause.seconds)) throw bad();
  } catch (const std::logic_error&) {  // stoll / stod: no number, or out of range
    throw bad();
  }
  if (second != std::string::npos) {
    if (text.substr(second + 1) != "torn") throw bad();
    pause.torn = true;
  }
  return pause;
}

FaultInjector::FaultInjector(const DebugConfig& debug, int64_t rank) : debug_(debug), rank_(rank) {
  if (debug_.allow_inject && !debug_.checkpoint_pause.empty()) pause_ = parse_checkpoint_pause(debug_.checkpoint_pause);
}

bool FaultInjector::pauses_checkpoints() const { return pause_.step > 0; }

void FaultInjector::after_first_checkpoint_file(int64_t step, const std::string& file) const {
  if (pause_.step != step) return;
  std::error_code ec;
  if (pause_.torn && std::filesystem::exists(file, ec))
    std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  sleep_seconds(pause_.seconds);
}

FaultInjector::~FaultInjector() = default;

void FaultInjector::attach(models::DiffusionModel& model) {
  if (!debug_.allow_inject || debug_.nan_grad_step <= 0) return;
  const auto named = model.named_parameters();
  at::Tensor target;
  for (const auto& p : named) {
    const bool match = debug_.nan_grad_param.empty() ? p.key().find("qkv.weight") != std::string::npos
                                                     : p.key() == debug_.nan_grad_param;
    if (match) {
      nan_param_ = p.key();
      target = p.value();
      break;
    }
  }
  if (!target.defined())
    throw ConfigError("'debug.inject.nan_grad_param' " +
                      (debug_.nan_grad_param.empty() ? std::string("(default: the first attention qkv weight)")
                                                     : "'" + debug_.nan_grad_param + "'") +
                      " names no parameter of this model (`flowtrain inspect` lists them)");
  if (rank_ != debug_.nan_grad_rank) return;
  // A tensor hook on the leaf runs before the gradient is accumulated, so the NaN reaches every
  // consumer (the clip's norm, FSDP's reduce-scatter) exactly as a NaN from the backward would.
  std::shared_ptr<bool> armed = armed_;
  target.register_hook([armed](const at::Tensor& grad) -> at::Tensor {
    if (!*armed) return grad;
    at::Tensor poisoned = grad.clone();
    poisoned.view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
    return poisoned;
  });
}

void FaultInjector::begin_step(int64_t step) {
  if (!debug_.allow_inject) return;
  if (step == debug_.nan_grad_step && !nan_fired_) {
    nan_fired_ = true;
    if (rank_ == debug_.nan_grad_rank) {
      *armed_ = true;
      spdlog::warn("debug.inject: a NaN goes into the gradient of {} at step {} on rank {}", nan_param_, step, rank_);
    }
  }
  const bool slowed = (debug_.slow_rank < 0 || debug_.slow_rank == rank_) && step >= debug_.slow_from_step;
  if (slowed) sleep_seconds(debug_.slow_seconds);
  if (debug_.leak_mib_per_step > 0) {
    const auto bytes = static_cast<size_t>(debug_.leak_mib_per_step * 1048576.0);
    auto block = std::make_unique<char[]>(bytes);
    std::memset(block.get(), 1, bytes);  // touched: resident, not just reserved
    leaked_.push_back(std::move(block));
  }
}

void FaultInjector::end_step() { *armed_ = false; }

void FaultInjector::before_data(int64_t step) const {
  if (!debug_.allow_inject) return;
  if ((debug_.slow_rank < 0 || debug_.slow_rank == rank_) && step >= debug_.slow_from_step)
    sleep_seconds(debug_.slow_worker_seconds);
}

double FaultInjector::loss_scale(int64_t step) {
  if (!debug_.allow_inject || step != debug_.spike_step || spike_fired_) return 1.0;
  spike_fired_ = true;
  spdlog::warn("debug.inject: step {}'s loss is scaled by {}", step, debug_.spike_factor);
  return debug_.spike_factor;
}

}  // namespace flowtrain::trainer
