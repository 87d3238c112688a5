#include "trainer/checkpoint/checkpoint_saver.h"

#include "data/serial_thread.h"

#include <chrono>

namespace flowtrain::trainer {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

CheckpointSaver::CheckpointSaver(std::string checkpoints_dir, int64_t keep, SaveGroup group, bool async)
    : checkpoints_dir_(std::move(checkpoints_dir)), keep_(keep), group_(std::move(group)), async_(async) {}

CheckpointSaver::~CheckpointSaver() {
  if (pending_.valid()) pending_.wait();
}

SaveOutcome CheckpointSaver::persist(const CheckpointContents& staged, double blocked_s) {
  SaveOutcome outcome;
  outcome.step = staged.progress.step;
  outcome.blocked_s = blocked_s;
  const auto t0 = Clock::now();
  try {
    outcome.path = save_checkpoint(checkpoints_dir_, staged, group_);
    if (group_.rank == 0) prune_checkpoints(checkpoints_dir_, keep_);
  } catch (const std::exception& e) {
    outcome.path.clear();
    outcome.error = e.what();
  }
  outcome.persist_s = seconds_since(t0);
  return outcome;
}

void CheckpointSaver::save(const CheckpointContents& contents) {
  const auto t0 = Clock::now();
  auto finish = [this](SaveOutcome outcome) {
    std::lock_guard<std::mutex> lock(finished_mutex_);
    finished_.push_back(std::move(outcome));
  };
  if (!async_) {  // straight from the training state: no staging copy, no extra memory
    SaveOutcome outcome = persist(contents, 0.0);
    outcome.blocked_s = outcome.persist_s;
    finish(std::move(outcome));
    return;
  }
  wait();  // one save in flight: the staging buffers are the previous save's until it is on disk
  CheckpointContents staged = stager_.stage(contents);  // CUDA: copies issued on a side stream
  const double blocked = seconds_since(t0);
  pending_ = std::async(std::launch::async, [this, staged = std::move(staged), blocked, finish]() {
    data::run_aten_serially_on_this_thread();  // the training step keeps the cores' OpenMP team
    stager_.wait();  // the copies have landed before the files are written from the buffers
    finish(persist(staged, blocked));
  });
}

void CheckpointSaver::wait() {
  if (!pending_.valid()) return;
  pending_.get();  // persist() catches everything: get() only joins
}

std::vector<SaveOutcome> CheckpointSaver::take_finished() {
  if (pending_.valid() && pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) pending_.get();
  std::lock_guard<std::mutex> lock(finished_mutex_);
  std::vector<SaveOutcome> out;
  out.swap(finished_);
  return out;
}

}  // namespace flowtrain::trainer
