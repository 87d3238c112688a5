#include "trainer/telemetry/profiler.h"

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <stdexcept>

namespace flowtrain::trainer {
namespace {

namespace kineto = torch::autograd::profiler;

}  // namespace

// Through the device-guard registry, so this file needs no CUDA headers and builds on CPU-only machines.
void synchronize_device(const c10::Device& device) {
  if (!device.is_cuda()) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::kCUDA);
  impl->synchronizeDevice(device.has_index() ? device.index() : impl->getDevice().index());
}

StepProfiler::StepProfiler(const ProfileConfig& config, std::string out_dir, int rank, bool cuda)
    : config_(config), cuda_(cuda && at::hasCUDA()) {
  trace_path_ = (std::filesystem::path(std::move(out_dir)) / "profiles" /
                 ("rank-" + std::to_string(rank) + "-step-" + std::to_string(config.start_step) + ".json"))
                    .string();
}

StepProfiler::~StepProfiler() {
  if (!running_) return;
  try {
    stop_and_save();
    spdlog::warn("profiler: the run ended inside the profiled window; saved a partial trace to {}", trace_path_);
  } catch (const std::exception& e) {
    spdlog::error("profiler: {}", e.what());
  }
}

void StepProfiler::step_begin(int64_t step) {
  if (!config_.enabled || running_ || step != config_.start_step) return;
  start();
}

void StepProfiler::step_end(int64_t step) {
  if (!running_ || step < config_.start_step + config_.num_steps - 1) return;
  stop_and_save();
}

void StepProfiler::start() {
  std::set<kineto::ActivityType> activities{kineto::ActivityType::CPU};
  if (cuda_) activities.insert(kineto::ActivityType::CUDA);
  const kineto::ProfilerConfig profiler_config(kineto::ProfilerState::KINETO, config_.record_shapes,
                                               /*profile_memory=*/config_.memory);
  if (cuda_) synchronize_device(c10::Device(c10::kCUDA));  // else the window mixes steps' kernels
  try {
    // prepare sets Kineto (and CUPTI) up; enable installs the RecordFunction callbacks on this
    // thread and starts collecting.
    kineto::prepareProfiler(profiler_config, activities);
    kineto::enableProfiler(profiler_config, activities);
  } catch (const std::exception& e) {
    throw std::runtime_error("profiler: cannot start Kineto for " + trace_path_ + ": " + e.what());
  }
  running_ = true;
  spdlog::info("profiler: recording steps {}..{} ({})", config_.start_step,
               config_.start_step + config_.num_steps - 1, cuda_ ? "CPU + CUDA" : "CPU");
}

void StepProfiler::stop_and_save() {
  running_ = false;
  if (cuda_) synchronize_device(c10::Device(c10::kCUDA));  // else the window mixes steps' kernels
  std::unique_ptr<kineto::ProfilerResult> result;
  try {
    result = kineto::disableProfiler();
  } catch (const std::exception& e) {
    throw std::runtime_error("profiler: cannot stop Kineto for " + trace_path_ + ": " + e.what());
  }
  if (!result) throw std::runtime_error("profiler: Kineto returned no result for " + trace_path_);

  // Saved under a temporary name and renamed, so a reader never opens half a trace. Kineto
  // reports a failed write only in its own log, hence the existence check.
  const std::filesystem::path path(trace_path_);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) throw std::runtime_error("profiler: cannot create " + path.parent_path().string() + ": " + ec.message());
  const std::string tmp = trace_path_ + ".tmp";
  result->save(tmp);
  if (!std::filesystem::exists(tmp))
    throw std::runtime_error("profiler: Kineto did not write the trace " + tmp + " (see its log above)");
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("profiler: cannot rename " + tmp + " to " + trace_path_ + ": " + ec.message());
  spdlog::info("profiler: wrote {} ({} events)", trace_path_, result->events().size());
}

ProfileRange::ProfileRange(const char* name) : guard_(at::RecordScope::USER_SCOPE) {
  if (guard_.isActive()) guard_.before(name);
}

}  // namespace flowtrain::trainer
