#include "trainer/checkpoint/checkpoint_controller.h"

#include "trainer/training_error.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

namespace fs = std::filesystem;

namespace flowtrain::trainer {

namespace {
void warn(const std::string& w) { spdlog::warn("{}", w); }
}  // namespace

CheckpointController::CheckpointController(const Config& config, CheckpointWiring wiring)
    : config_(config), wiring_(std::move(wiring)) {
  SaveGroup group{wiring_.rank, {}, {}};
  group.after_first_file = wiring_.after_first_file;
  if (parallel::Runtime* runtime = wiring_.runtime) {
    const int64_t world = wiring_.world;
    group.all_ok = [runtime, world](bool ok) {  // from the saver's thread: the checkpoint group only
      at::Tensor votes = at::full({1}, ok ? 1 : 0, at::TensorOptions().dtype(at::kLong));
      runtime->checkpoint_group().all_reduce(votes, parallel::ReduceOp::Sum)->wait();
      return votes.item<int64_t>() == world;
    };
  }
  saver_ = std::make_unique<CheckpointSaver>(checkpoints_dir(), config_.checkpoint.keep, std::move(group),
                                             config_.checkpoint.async);
}

CheckpointController::~CheckpointController() = default;

std::string CheckpointController::checkpoints_dir() const {
  return (fs::path(config_.run.out_dir) / "checkpoints").string();
}

std::string CheckpointController::resume_point() {
  const std::string& resume = config_.checkpoint.resume;
  if (wiring_.rank == 0) prune_checkpoints(checkpoints_dir(), /*keep=*/0);  // only removes interrupted saves
  if (wiring_.runtime) wiring_.runtime->world_group().barrier();
  if (resume == "never") return "";
  // Every rank reads the same directory and verifies the same files, so all pick the same one.
  if (resume == "auto") return newest_verified().value_or("");
  return resume;  // an explicit path: any problem with it is an error, not a fallback
}

std::optional<std::string> CheckpointController::newest_verified() const {
  return find_latest_checkpoint(checkpoints_dir(), warn);
}

bool CheckpointController::due(int64_t step, bool last) const {
  const int64_t every = config_.checkpoint.every;
  return (every > 0 && step % every == 0) || (last && wiring_.final_checkpoint);
}

void CheckpointController::reserve_staging(const std::function<CheckpointContents()>& tensors) {
  // Only where saves recur: a run whose only save is its last would hold one more copy of its
  // state in host memory all run long for a save that blocks the exit anyway.
  if (!saver_->async() || config_.checkpoint.every <= 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  saver_->reserve_staging(tensors());
  spdlog::info("checkpoint: {:.1f} MiB of staging buffers for asynchronous saves allocated in {:.2f} s",
               saver_->staging_bytes() / double(1 << 20),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void CheckpointController::save(const CheckpointContents& contents) {
  saver_->save(contents);  // async: returns once the state is staged; sync: once it is committed
  last_step_ = contents.progress.step;
  report(saver_->take_finished());
}

void CheckpointController::report(const std::vector<SaveOutcome>& outcomes) {
  for (const SaveOutcome& o : outcomes) {
    if (o.ok()) {
      spdlog::info("checkpoint {} committed: training blocked {:.2f} s, {} {:.2f} s", o.path, o.blocked_s,
                   saver_->async() ? "persisted in the background in" : "written in", o.persist_s);
    } else {
      ++failures_;
      last_failed_step_ = o.step;
      last_error_ = o.error;
      if (config_.checkpoint.on_error == SaveFailurePolicy::warn) {
        spdlog::warn("{} — training goes on (checkpoint.on_error: warn; {} failed save(s) so far); the next save "
                     "is at the next interval",
                     o.error, failures_);
      } else if (stop_error_.empty()) {
        spdlog::error("{} — stopping (checkpoint.on_error: stop)", o.error);
        stop_error_ = o.error;
      }
    }
    if (wiring_.record)
      wiring_.record(o.step, {{"checkpoint_blocked_s", o.blocked_s},
                              {"checkpoint_persist_s", o.persist_s},
                              {"checkpoint_failures", double(failures_)}});
  }
}

void CheckpointController::finish() {
  saver_->wait();
  report(saver_->take_finished());
  if (!stop_error_.empty())
    throw TrainingError(fmt::format("{}; the newest complete checkpoint in {} is intact", stop_error_,
                                    checkpoints_dir()));
}

void CheckpointController::require_saved(int64_t step, const char* what) const {
  // Even under on_error: warn, a run does not end with its last state unsaved and exit 0.
  if (last_failed_step_ == step)
    throw TrainingError(fmt::format("{} (step {}) could not be written: {}; the newest complete checkpoint in "
                                    "{} is intact",
                                    what, step, last_error_, checkpoints_dir()));
}

}  // namespace flowtrain::trainer
