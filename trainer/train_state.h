// The trainable state behind the training loop — weights, gradients' path to the optimizer,
// AdamW, EMA, checkpoint contents — in two layouts with one interface:
//
//   LocalTrainState    one process holds everything (world 1, the reference).
//   ShardedTrainState  FSDP (parallel/fsdp.h): each rank holds 1/N of the fp32 master weights,
//                      gradients, AdamW moments and EMA; gathers weights per block as it computes.
//
// The loop (trainer.cpp) reads the same for both: for each micro-batch begin → forward →
// backward → end; then reduce_and_clip → optimizer_step → ema_update.
#pragma once

#include "models/flow_matching.h"
#include "models/linear.h"
#include "models/model.h"
#include "parallel/runtime.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/parallelize.h"

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace flowtrain::trainer {

// What a step's collective bookkeeping returns: the global gradient norm (before clipping),
// the data-parallel mean loss, and whether any rank asked to stop (a signal), agreed by all.
struct StepReduction {
  at::Tensor grad_norm, loss, stop;
  at::Tensor local_gradient_sum;  // this rank's own gradients summed before any reduction (health)
  at::Tensor param_norms;         // one process: per-parameter gradient norms, forward order (health)
};

class TrainState {
 public:
  virtual ~TrainState() = default;
  virtual models::DiffusionModel& model() = 0;  // run the forward through this
  virtual void begin_micro_batch(bool last_of_step) {}
  virtual void end_micro_batch() {}
  // Global grad norm; grads are scaled in place by min(1, max_norm/norm) when max_norm > 0.
  virtual StepReduction reduce_and_clip(const at::Tensor& local_loss, double max_norm, bool stop_requested) = 0;
  virtual void optimizer_step(double lr) = 0;  // AdamW, then gradients cleared
  // Drops the step's gradients without an update (health.nonfinite / spike: skip).
  virtual void discard_gradients() = 0;
  // Parameter names in forward order (the order of StepReduction::param_norms).
  virtual std::vector<std::string> parameter_names() const = 0;
  // The parameters (forward order) whose reduced gradient has a non-finite value on any rank; a
  // collective (every rank calls it). Gradients must still be present. Multi-rank states only:
  // one process names them from the per-parameter norms the health monitor keeps for each step
  // (StepObservation::param_norms), which outlive the gradients when a verdict is read later.
  virtual std::vector<std::string> nonfinite_gradients() {
    throw std::logic_error("TrainState::nonfinite_gradients: a multi-rank state's question");
  }
  // The tensors AdamW updates on this rank (the parameters, or FSDP's flat unit shards), and the
  // global squared L2 norm of each named parameter's part of `tensors` (laid out like
  // trainable_tensors(): their gradients, copies, differences). Under FSDP a collective.
  virtual std::vector<at::Tensor> trainable_tensors() = 0;
  virtual std::vector<std::pair<std::string, double>> parameter_sq_norms(const std::vector<at::Tensor>& tensors) = 0;
  virtual void ema_update(double decay) = 0;
  virtual bool has_ema() const = 0;
  virtual int64_t optimizer_step_count() const = 0;
  // Runs `fn` with the weights to sample from (the EMA when kept, else the raw weights) as a
  // velocity function, in eval mode, under no-grad and the training precision's autocast. Under
  // FSDP this is a collective: every rank calls it and makes the same number of forward calls in
  // `fn`; the weights are gathered one unit at a time as the forward runs, so no full copy of
  // the model exists on any rank.
  virtual void with_sampling_model(const std::function<void(const models::VelocityFn&)>& fn) = 0;
  virtual void fill_checkpoint(CheckpointContents& contents) = 0;
  // Loads weights, EMA and optimizer state; returns the checkpoint (progress, rng, config).
  virtual CheckpointContents restore(const std::string& dir) = 0;
  // Bytes of persistent training state on this rank: parameters + gradients + AdamW moments
  // (+ EMA), counted from the tensors themselves.
  virtual int64_t state_bytes() const = 0;
};

// The bytes a tensor holds; 0 for an undefined one (a gradient not yet made). state_bytes() counts
// with it.
inline int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Both take a model its family has already parallelised (trainer/parallelize.h); the sharded
// state holds the FSDP wrapper that returned.
std::unique_ptr<TrainState> make_local_train_state(std::shared_ptr<models::DiffusionModel> model,
                                                   const Config& config);
std::unique_ptr<TrainState> make_sharded_train_state(std::shared_ptr<models::DiffusionModel> model,
                                                     const Config& config, parallel::Runtime& runtime,
                                                     Parallelized parallelized);

}  // namespace flowtrain::trainer
