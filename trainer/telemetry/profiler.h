// Kineto profiling of a window of training steps, and named ranges that show up in the trace.
//
// StepProfiler records CPU ops (and CUDA kernels/memcpys when `cuda`) of steps
// [start_step, start_step + num_steps) and saves one Chrome trace per rank,
// <out_dir>/profiles/rank-R-step-S.json, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. ProfileRange marks a span ("forward", "data_wait", …) in that trace;
// with no profiler running it costs one thread-local check.
//
// Only the thread that calls step_begin is recorded (the RecordFunction callbacks Kineto
// installs are thread-local): loader threads are not in the trace, their effect shows up as
// "data_wait" on the training thread.
#pragma once

#include "trainer/config/config.h"

#include <ATen/record_function.h>

#include <cstdint>
#include <string>

namespace flowtrain::trainer {

// Waits for the device's queued work (a no-op on the CPU): for a time that is the work's own.
void synchronize_device(const c10::Device& device);

class StepProfiler {
 public:
  // out_dir: the run directory. Nothing happens (and nothing is created) unless
  // config.enabled. `cuda` adds CUDA activities; ignored when no CUDA device is present.
  StepProfiler(const ProfileConfig& config, std::string out_dir, int rank, bool cuda);
  // Saves a trace cut short by the run ending inside the window; never throws (logs instead).
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // step: the 1-based step about to run. Starts the profiler when step == start_step.
  // Throws std::runtime_error if Kineto cannot be enabled (e.g. another profiler is active).
  void step_begin(int64_t step);
  // After the step. Stops and saves when step == start_step + num_steps - 1. Throws
  // std::runtime_error naming the trace file if it cannot be written.
  void step_end(int64_t step);

  bool running() const { return running_; }
  // Where this rank's trace goes (whether or not it has been written yet).
  const std::string& trace_path() const { return trace_path_; }

 private:
  void start();
  void stop_and_save();

  ProfileConfig config_;
  std::string trace_path_;
  bool cuda_ = false;
  bool running_ = false;
};

// RAII named range (a USER_SCOPE RecordFunction, like Python's torch.profiler.record_function).
// `name` must outlive the range; pass a string literal.
class ProfileRange {
 public:
  explicit ProfileRange(const char* name);
  ~ProfileRange() = default;  // the RecordFunction's destructor ends the range
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace flowtrain::trainer
