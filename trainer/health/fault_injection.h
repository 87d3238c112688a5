// Fault injection for tests and drills (config `debug`, refused unless debug.allow_inject): the
// one mechanism for every deliberate fault — a NaN in one gradient on one rank, a loss spike, a
// slow rank (compute or data), a host-memory leak, a pause (or a torn file) inside a checkpoint
// save. The wrong FSDP reduction (debug.inject.reduction) is handed by trainer/parallelize.cpp
// to FSDP, which applies it (parallel/fsdp.h ReductionFault). Each fault fires at its configured step the first time the run reaches it, so a run that
// rolls back past the step does not meet the same fault again (a drill of one incident).
#pragma once

#include "models/model.h"
#include "trainer/config/config.h"
#include "trainer/health/checkpoint_pause.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace flowtrain::trainer {

class FaultInjector {
 public:
  FaultInjector(const DebugConfig& debug, int64_t rank);
  ~FaultInjector();
  // Resolves debug.inject.nan_grad_param on the model and hooks its gradient (every rank checks
  // the name; only nan_grad_rank arms it). Throws ConfigError for a name the model lacks.
  void attach(models::DiffusionModel& model);
  // At the start of step `step` (1-based): arms the gradient NaN, sleeps the slow compute, leaks.
  void begin_step(int64_t step);
  void end_step();
  // Before the batch is taken: the slow data worker's delay (charged to the data wait).
  void before_data(int64_t step) const;
  // The spike: the step's loss (and so its gradients) scaled by spike_factor, once.
  double loss_scale(int64_t step);
  // debug.inject.checkpoint_pause: called by the checkpoint writer after the first file of step
  // `step`'s checkpoint (`file`) is written, on whichever thread writes it.
  bool pauses_checkpoints() const;
  void after_first_checkpoint_file(int64_t step, const std::string& file) const;

 private:
  DebugConfig debug_;
  int64_t rank_;
  CheckpointPause pause_;  // step 0: off
  std::string nan_param_;
  std::shared_ptr<bool> armed_ = std::make_shared<bool>(false);  // read by the autograd hook
  bool nan_fired_ = false, spike_fired_ = false;
  std::vector<std::unique_ptr<char[]>> leaked_;
};

}  // namespace flowtrain::trainer
