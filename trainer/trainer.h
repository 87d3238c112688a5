// The training loop for one process (world size 1; the distributed runtime is a later layer).
//
// One step reads top to bottom (trainer.cpp, Trainer::run):
//   periodic sample grid / checkpoint  →  grad_accum × (batch → flow-matching loss → backward)
//   → global-norm clip → AdamW on fp32 weights → EMA → one log line + metrics.jsonl
#pragma once

#include "data/loader.h"
#include "models/dit.h"
#include "models/flow_matching.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"
#include "trainer/profiler.h"
#include "trainer/run_log.h"
#include "trainer/tensorboard.h"

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>

namespace flowtrain::trainer {

struct TrainingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Per-step timings for callers that measure (flowtrain bench). Filled after every step when
// TrainerHooks::on_step is set; the step is synchronised first, so times are real.
struct StepStats {
  int64_t step = 0;
  double step_time_s = 0;
  double data_wait_s = 0;
  double loss = 0;
};

struct TrainerHooks {
  bool final_checkpoint = true;                    // write a checkpoint after the last step
  std::function<void(const StepStats&)> on_step;   // called after each step (synchronised)
};

class Trainer {
 public:
  explicit Trainer(Config config, TrainerHooks hooks = {});
  const models::DiT& model() const { return model_; }
  c10::Device device() const { return device_; }
  // Trains to train.steps (or until a stop signal, after which it checkpoints). Returns the
  // number of optimizer steps completed in total.
  int64_t run();

 private:
  struct StepResult { at::Tensor loss, grad_norm; double data_wait_s; };

  void prepare_run_dir();
  void restore(const std::string& checkpoint_dir);
  StepResult train_step();
  void write_checkpoint();
  void write_samples();
  void evaluate();
  void log_step(const StepResult& r, double step_time, double data_wait);
  void check_finite(const char* when);
  std::string resolve_resume() const;

  Config config_;
  TrainerHooks hooks_;
  std::string config_yaml_;
  c10::Device device_{c10::kCPU};
  models::DiT model_{nullptr};
  std::unique_ptr<Ema> ema_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  models::TimestepSampler timesteps_;
  std::shared_ptr<const data::ImageDataset> dataset_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // null when train.tensorboard is off
  std::unique_ptr<StepProfiler> profiler_;          // null when profile.enabled is off
  TrainProgress progress_;
  at::Tensor all_finite_;  // device flag: every loss / grad norm since the last check was finite
  int64_t last_checkpoint_step_ = -1;
};

// 64-bit seed for the generator of (run seed, rank, step, micro-batch): a pure function, so a
// resumed run draws the same timesteps, noise and label dropout as the uninterrupted one.
uint64_t step_seed(int64_t run_seed, int64_t rank, int64_t step, int64_t micro);

}  // namespace flowtrain::trainer
