// Training checkpoints: a directory per step, safetensors files for tensors plus a JSON manifest.
//
//   checkpoints/step-0000500/
//     model.safetensors       fp32 master weights, reference key names (blocks.0.attn.qkv.weight …)
//     ema.safetensors         EMA weights, same keys (absent when train.ema_decay = 0)
//     optimizer.safetensors   AdamW state: exp_avg.<key>, exp_avg_sq.<key>
//     rng.safetensors         generator states (cpu; cuda when used)
//     manifest.json           step, data-loader state per rank, LR/optimizer counters, the resolved
//                             config, world layout, and size + CRC-32 of every file above
//
// Commit protocol: everything is written into `step-NNNNNNN.tmp/`, each file fsynced, the
// manifest last; then the directory is renamed to `step-NNNNNNN/` and its parent fsynced. A
// crash at any point leaves either the previous checkpoints untouched plus a `.tmp` directory
// (ignored and removed on the next start) or a complete checkpoint. Loading verifies every
// file's size and CRC against the manifest, so a damaged checkpoint is refused by name.
//
// Growth path (sharded, asynchronous saves): the manifest's "layout" already records the world
// size and, per file, which rank wrote it; a sharded save adds per-rank files and per-tensor
// slice records without changing the commit protocol.
#pragma once

#include "data/loader.h"
#include "trainer/state_dict.h"

#include <functional>
#include <optional>
#include <string>

namespace flowtrain::trainer {

struct TrainProgress {
  int64_t step = 0;           // optimizer steps completed
  int64_t samples_seen = 0;
  double lr = 0.0;            // lr used by the last step
  data::LoaderState loader;   // rank 0 (world 1); one entry per rank once sharded
};

struct CheckpointContents {
  NamedTensors model;
  NamedTensors ema;        // may be empty
  NamedTensors optimizer;  // exp_avg.<key>, exp_avg_sq.<key>
  NamedTensors rng;        // "cpu" (+ "cuda:<i>")
  TrainProgress progress;
  int64_t optimizer_step_count = 0;
  std::string config_yaml;  // the resolved config of the run that wrote it
};

std::string checkpoint_name(int64_t step);  // "step-0000500"

// Writes a checkpoint under `checkpoints_dir` with the commit protocol above; returns its path.
std::string save_checkpoint(const std::string& checkpoints_dir, const CheckpointContents& contents);

// Reads and verifies a checkpoint directory. Throws CheckpointError naming the file on any
// missing, truncated or corrupt part.
CheckpointContents load_checkpoint(const std::string& dir);

// Cheap verification (manifest + sizes + CRCs) without loading tensors; returns "" if valid,
// else the reason.
std::string verify_checkpoint(const std::string& dir);

// The newest complete, verified checkpoint under `checkpoints_dir`, or nullopt. Invalid ones are
// reported through `warn` and skipped (a corrupt newest checkpoint falls back to the previous).
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoints_dir,
                                                  const std::function<void(const std::string&)>& warn);

// Removes `*.tmp` leftovers of interrupted saves, then all but the newest `keep` complete
// checkpoints (keep = 0: keep all).
void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep);

}  // namespace flowtrain::trainer
