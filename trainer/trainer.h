// The training loop, the same for one process and for N ranks (trainer/train_state.h holds what
// differs: one full copy of the weights, or FSDP shards).
//
// One step reads top to bottom (trainer.cpp, Trainer::train_step):
//   grad_accum × (this rank's slice of the global batch → flow-matching loss → backward)
//   → gradient reduction + global-norm clip → AdamW → EMA → one log line + metrics.jsonl
//   then periodic sample grid / eval / checkpoint (rank 0 writes; collectives on all ranks).
#pragma once

#include "models/model.h"
#include "models/flow_matching.h"
#include "models/fp8/convert.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_controller.h"
#include "trainer/config/config.h"
#include "trainer/data_session.h"
#include "trainer/eval/evaluator.h"
#include "trainer/health/block_telemetry.h"
#include "trainer/health/fault_injection.h"
#include "trainer/health/health_monitor.h"
#include "parallel/context.h"
#include "parallel/env.h"
#include "parallel/runtime.h"
#include "trainer/optimizer.h"
#include "trainer/telemetry/profiler.h"
#include "trainer/telemetry/run_log.h"
#include "trainer/telemetry/tensorboard.h"
#include "trainer/family.h"
#include "trainer/frozen/online_encoding.h"
#include "trainer/run_conditioning.h"
#include "trainer/train_state.h"
#include "trainer/training_error.h"

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>

namespace flowtrain::trainer {

// Per-step timings for callers that measure (flowtrain bench). Filled after every step when
// TrainerHooks::on_step is set; the step is synchronised first, so times are real.
struct StepStats {
  int64_t step = 0;
  double step_time_s = 0;
  double data_wait_s = 0;
  double encode_s = 0;  // the frozen encoders in the step (online_encoding.h); 0 without
  double loss = 0;
};

struct TrainerHooks {
  bool final_checkpoint = true;                    // write a checkpoint after the last step
  std::function<void(const StepStats&)> on_step;   // called after each step (synchronised)
};

class Trainer {
 public:
  explicit Trainer(Config config, TrainerHooks hooks = {});
  ~Trainer();
  models::DiffusionModel& model() { return state_->model(); }
  int64_t rank() const { return env_.rank; }
  int64_t world() const { return env_.world; }
  // Persistent training-state bytes on this rank (weights, grads, AdamW, EMA): the memory report.
  int64_t state_bytes() const { return state_->state_bytes(); }
  c10::Device device() const { return device_; }
  // Bytes of the data set this run holds in memory (0 for streamed shards).
  int64_t dataset_bytes() const;
  // Host bytes of the asynchronous checkpoint's staging buffers (0 before the first async save).
  int64_t checkpoint_staging_bytes() const { return checkpoints_->staging_bytes(); }
  // Every rank's `value`, by rank (a collective over the world in a multi-rank run).
  std::vector<int64_t> gather_from_ranks(int64_t value);
  // Trains to train.steps (or until a stop signal, after which it checkpoints). Returns the
  // number of optimizer steps completed in total.
  int64_t run();

 private:
  struct StepResult {
    at::Tensor loss, grad_norm, stop;
    double data_wait_s = 0, comm_wait_s = 0, encode_s = 0;
    HealthAction action = HealthAction::Continue;  // Skip: no update was applied; Rollback: to be done
  };

  void prepare_run_dir();
  void restore(const std::string& checkpoint_dir);
  StepResult train_step();
  // The start-up lines on how the model was parallelised (FSDP, context parallelism, recompute).
  void log_parallel_layout(const models::DiffusionModel& model,
                           std::optional<parallel::ContextAttention> cp_attention) const;
  // The checkpoint controller, with its commit vote over the checkpoint group and any injected pause.
  void make_checkpoint_controller();
  // health rollback: restores the newest complete checkpoint and continues past the batch of the
  // failed step (its ordinal joins skip_batches). Throws TrainingError when there is none.
  void rollback(const std::string& reason);
  HealthMonitor::Wiring health_wiring();
  void write_checkpoint();
  // The tensors a checkpoint holds (state, RNG, fp8 history), without the progress and config
  // write_checkpoint adds; what the controller sizes its staging buffers from.
  CheckpointContents checkpoint_tensors();
  void write_samples();
  void evaluate();
  // `total` rows made by make(first, count), split over the data-parallel ranks (each makes its
  // padded slice) and gathered: every rank gets all of them, on the CPU. Collective under FSDP.
  at::Tensor sample_rows_on_all_ranks(int64_t total, const std::function<at::Tensor(int64_t, int64_t)>& make);
  void log_step(const StepResult& r, double step_time, double data_wait, double encode,
                std::map<std::string, double> health);
  // Judges steps the health monitor kept on the device; throws TrainingError on a stop verdict.
  void check_health(const char* when);
  void barrier();  // all ranks (no-op in one process)
  void write_rank_report();  // <out_dir>/ranks/rank-RRRRR.json
  bool lead() const { return env_.rank == 0; }

  Config config_;
  TrainerHooks hooks_;
  std::string config_yaml_;
  c10::Device device_{c10::kCPU};
  parallel::DistEnv env_;
  std::unique_ptr<parallel::Runtime> runtime_;  // null in a single-process run
  int64_t dp_rank_ = 0, dp_size_ = 1;           // this rank's slice of each global batch
  RunConditioning conditioning_;  // what conditions the batches, grids and evaluations
  const FamilySpec::Objective* objective_ = nullptr;  // the family's own objective; null: flow matching
  std::map<std::string, FrozenFileRecord> frozen_files_;  // the frozen models' files, for checkpoints
  std::unique_ptr<OnlineEncoder> online_;  // the frozen encoders the step runs; null when data is precomputed
  std::unique_ptr<TrainState> state_;
  models::fp8::Fp8Conversion fp8_;  // the linears computing in fp8 (none unless fp8.recipe is set)
  LrSchedule schedule_;
  models::TimestepSampler timesteps_;
  std::unique_ptr<DataSession> data_;  // the batches, their order and its resume state
  std::unique_ptr<MetricsWriter> metrics_;          // rank 0 only
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0, when train.tensorboard is on
  std::unique_ptr<StepProfiler> profiler_;          // null when profile.enabled is off
  TrainProgress progress_;
  std::unique_ptr<HealthMonitor> health_;
  std::unique_ptr<Evaluator> evaluator_;  // the run's task's evaluation; null with eval.every 0
  std::unique_ptr<FaultInjector> faults_;
  BlockTelemetry telemetry_{0};
  int64_t rollbacks_ = 0;
  // What the health checks cost: host seconds spent in them, and the training steps (and their
  // seconds) they covered, over this process's logged intervals.
  double health_seconds_ = 0, train_seconds_ = 0;
  int64_t health_steps_ = 0;
  // Resume point, saves and their failure policy; uses runtime_'s checkpoint group: released before it.
  std::unique_ptr<CheckpointController> checkpoints_;
  int64_t peak_state_bytes_ = 0;  // weights + grads + AdamW + EMA on this rank, at its largest (grads present)
};

// 64-bit seed for the generator of (run seed, rank, step, micro-batch): a pure function, so a
// resumed run draws the same timesteps, noise and label dropout as the uninterrupted one.
uint64_t step_seed(int64_t run_seed, int64_t rank, int64_t step, int64_t micro);

// The flow-matching draws (t, noise, conditioning dropout) of rows [first_row, first_row + B) of step
// `step`'s global batch. CPU: each row's generator is seeded from (run seed, step, global row), so
// a resumed run and any data-parallel layout of the same global batch draw exactly the same.
// CUDA (x0 on the GPU): one device generator per (run seed, step, first_row), drawn on the GPU:
// the same for a resume at the same layout, other noise at another layout.
models::FlowMatchingDraw draw_step_inputs(const Config& config, const models::TimestepSampler& timesteps,
                                          const models::ConditioningDropout& dropout, const at::Tensor& x0,
                                          const models::Conditioning& cond, int64_t step, int64_t first_row);

}  // namespace flowtrain::trainer
