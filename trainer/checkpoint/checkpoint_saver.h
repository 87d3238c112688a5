// Saving checkpoints while training goes on: the three stages of a save and the rule of one save
// in flight.
//
//   1. stage    copy this rank's state into reused host buffers (staging.h); training waits for
//               this on the CPU; on CUDA the copies overlap the next forward/backward and only the
//               optimizer step waits for them (before_state_update)
//   2. persist  write each file, taking its size and CRC-32 as it is written (a background thread)
//   3. commit   every rank votes over the checkpoint process group; rank 0 writes the manifest and
//               renames the directory (save_checkpoint's protocol, checkpoint.h)
//
// A new save first waits for the previous one. Synchronous mode (checkpoint.async: false) runs
// stages 2 and 3 on the caller's thread with the same code, so both modes write the same bytes.
// Outcomes (committed or failed, with times) are collected by the owner, which applies the
// failure policy; the saver itself never throws a persist failure at the training loop.
#pragma once

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/staging.h"

#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace flowtrain::trainer {

struct SaveOutcome {
  int64_t step = 0;
  std::string path;       // the committed checkpoint directory; empty when the save failed
  std::string error;      // empty when committed
  double blocked_s = 0;   // training blocked: waiting for the previous save, staging (and, when
                          // synchronous, persisting and committing)
  double persist_s = 0;   // write + hash + commit (+ pruning old checkpoints)
  bool ok() const { return error.empty(); }
};

class CheckpointSaver {
 public:
  // `keep`: newest complete checkpoints kept after each commit (0 = all; rank 0 prunes).
  CheckpointSaver(std::string checkpoints_dir, int64_t keep, SaveGroup group, bool async);
  ~CheckpointSaver();  // waits for the save in flight: a save is never abandoned half-written
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Saves `contents`, whose tensors may be the live training state: they are copied before this
  // returns, so the caller may change them right after.
  void save(const CheckpointContents& contents);
  // Async: allocates the staging buffers for a state of these shapes now (CheckpointStager::
  // reserve), so that no save, the first included, waits for an allocation. Sync saves stage
  // nothing: a no-op.
  void reserve_staging(const CheckpointContents& contents) {
    if (async_) stager_.reserve(contents);
  }
  // Call before the state is overwritten (optimizer step, EMA update): on CUDA the device's
  // current stream waits for the staging copies of the last save (the host does not block).
  void before_state_update() { stager_.before_state_update(); }
  // Blocks until the save in flight (if any) is committed or has failed.
  void wait();
  // Outcomes of the saves finished since the last call, oldest first; never blocks.
  std::vector<SaveOutcome> take_finished();
  bool async() const { return async_; }
  int64_t staging_bytes() const { return stager_.buffer_bytes(); }

 private:
  SaveOutcome persist(const CheckpointContents& staged, double blocked_s);

  std::string checkpoints_dir_;
  int64_t keep_;
  SaveGroup group_;
  bool async_;
  CheckpointStager stager_;
  std::future<void> pending_;
  std::mutex finished_mutex_;
  std::vector<SaveOutcome> finished_;
};

}  // namespace flowtrain::trainer
