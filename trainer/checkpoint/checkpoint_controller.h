// The run's checkpoint policy, between the training loop and the CheckpointSaver: which
// checkpoint a run resumes or rolls back to, when a save is due, the commit vote over the
// checkpoint group, and what a failed save does (checkpoint.on_error: warn goes on, stop stops
// every rank at the next step's vote; neither lets a run end with its last state unsaved).
// The loop hands it the contents to save; it never reads training state itself.
#pragma once

#include "parallel/runtime.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_saver.h"
#include "trainer/config/config.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flowtrain::trainer {

struct CheckpointWiring {
  int64_t rank = 0, world = 1;
  parallel::Runtime* runtime = nullptr;  // null in a single-process run: no vote, no barrier
  bool final_checkpoint = true;          // a checkpoint after the last step (TrainerHooks)
  // After a rank's first file of a save is written (an injected pause: debug.inject); may be empty.
  std::function<void(int64_t step, const std::string& file)> after_first_file;
  // Where a save's timings and the failure count go (metrics.jsonl); may be empty.
  std::function<void(int64_t step, const std::map<std::string, double>& values)> record;
};

class CheckpointController {
 public:
  CheckpointController(const Config& config, CheckpointWiring wiring);
  ~CheckpointController();  // waits for the save in flight: uses the runtime's checkpoint group

  std::string checkpoints_dir() const;
  // Clears the leftovers of interrupted saves (rank 0; all ranks wait for it) and names the
  // checkpoint to resume from per checkpoint.resume: "" for none. Every rank picks the same one.
  std::string resume_point();
  // The newest checkpoint that verifies (for a rollback: finish() first).
  std::optional<std::string> newest_verified() const;
  // A checkpoint of `step` was restored: it counts as saved.
  void restored(int64_t step) { last_step_ = step; }

  // Whether the step just taken ends with a save: every checkpoint.every, and the last one.
  bool due(int64_t step, bool last) const;
  bool saved(int64_t step) const { return last_step_ == step; }
  // Async saves at an interval: the staging buffers allocated before the first step (logged).
  // `tensors` gives the state's tensors (not called when nothing is reserved).
  void reserve_staging(const std::function<CheckpointContents()>& tensors);
  // Saves `contents` (async: returns once it is staged) and reports the saves that finished.
  void save(const CheckpointContents& contents);
  // Reports the saves finished since the last call: before each step, so that a failure joins
  // that step's stop vote.
  void poll() { report(saver_->take_finished()); }
  // Before the state is overwritten: a save's device copies finish first (CUDA).
  void before_state_update() { saver_->before_state_update(); }
  // A save failed under checkpoint.on_error: stop; the run stops at the next vote.
  bool stop_requested() const { return !stop_error_.empty(); }
  // Waits for the save in flight; throws TrainingError if a save failed under on_error: stop.
  void finish();
  // Throws TrainingError if the save of `step` failed (the stop and final checkpoints).
  void require_saved(int64_t step, const char* what) const;
  // Host bytes of the asynchronous saves' staging buffers (0 before they are reserved).
  int64_t staging_bytes() const { return saver_->staging_bytes(); }

 private:
  void report(const std::vector<SaveOutcome>& outcomes);

  const Config& config_;
  CheckpointWiring wiring_;
  std::unique_ptr<CheckpointSaver> saver_;
  int64_t last_step_ = -1;     // the step of the newest save begun or checkpoint restored
  std::string stop_error_;     // a failed save under on_error: stop
  int64_t failures_ = 0;
  int64_t last_failed_step_ = -1;
  std::string last_error_;
};

}  // namespace flowtrain::trainer
