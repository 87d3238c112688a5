// Training checkpoints: a directory per step, safetensors files for tensors plus a JSON manifest.
//
//   checkpoints/step-0000500/
//     model.safetensors       fp32 master weights, reference key names (blocks.0.attn.qkv.weight …)
//     ema.safetensors         EMA weights, same keys (absent when train.ema_decay = 0)
//     optimizer.safetensors   AdamW state: exp_avg.<key>, exp_avg_sq.<key>
//     rng.safetensors         generator states (cpu; cuda when used)
//     manifest.json           step, data-loader state per rank, LR/optimizer counters, the resolved
//                             config, world layout, size + CRC-32 of every file above, and the
//                             frozen models' files (path, size + CRC-32) the run trained with
//
// Commit protocol: everything is written into `step-NNNNNNN.tmp/`, each file fsynced, the
// manifest last; then the directory is renamed to `step-NNNNNNN/` and its parent fsynced. A
// crash at any point leaves either the previous checkpoints untouched plus a `.tmp` directory
// (ignored and removed on the next start) or a complete checkpoint. Loading verifies every
// file's size and CRC against the manifest, so a damaged checkpoint is refused by name.
//
// Sharded (FSDP) checkpoints: every shard writes its own files, `model.shard-K-of-N.safetensors`
// (and ema., optimizer.), keyed by unit ("stem", "blocks.3", "head"), plus rank 0's `fixed.safetensors`
// (unsharded parameters) and rng; the manifest's "layout" records the units (trainer/checkpoint/shard_layout.h)
// and every file's CRC. The commit protocol is the same, each phase closed by a vote of all ranks
// (SaveGroup): rank 0 creates the .tmp directory; all writers write and record their digests;
// rank 0 writes the manifest and renames.
// load_checkpoint() consolidates any checkpoint to full named tensors (export, eval, a resume at
// another world size); load_checkpoint_shard() reads one shard for an exact same-layout resume.
#pragma once

#include "data/loader.h"
#include "trainer/checkpoint/shard_layout.h"
#include "trainer/checkpoint/state_dict.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain::trainer {

// data.source shards: the loader state of every data-parallel rank, merged when saved (each
// canonical stream's count comes from the rank that owns it). A resumed rank starts from it
// at any world size (data/shards/stream_plan.h).
struct ShardsDataState {
  int64_t world = 1;  // data-parallel ranks at the save
  int64_t global_batch = 0;
  uint64_t fingerprint = 0;  // data::ShardLoader::fingerprint: the shards, counts and order settings
  int64_t epoch = 0;
  int64_t batches_left = 0;  // valid for a resume at the same world size
  std::vector<int64_t> stream_counts;
  int64_t skipped = 0, repeated = 0;  // over all ranks, over the run
  // Lines in each data-parallel rank's data.record_keys file at the save; ranks of an earlier,
  // wider world keep their entries.
  std::vector<int64_t> keys_written;
  // With data.buckets: every rank's samples waiting in buckets, (stream, draw) pairs flattened.
  std::vector<int64_t> pending;
};

struct TrainProgress {
  int64_t step = 0;           // optimizer steps completed
  int64_t samples_seen = 0;
  double lr = 0.0;            // lr used by the last step
  data::LoaderState loader;   // in-memory source: the global state; shards: this rank's
  std::optional<ShardsDataState> shards;  // shards: all ranks' state (set at a save, read at a resume)
  // Health (trainer/health/): batches drawn so far (ordinals count from 1; a skipped batch is
  // drawn too), the ordinals still to discard, and the updates skipped by policy so far.
  int64_t batches_drawn = 0;
  std::set<int64_t> skip_batches;
  int64_t skipped_updates = 0;
};

// This rank's part of a sharded state; model/ema/optimizer then hold unit-keyed shard tensors.
struct ShardedContents {
  ShardLayout layout;
  int64_t shard_index = 0;
  bool writer = true;   // HSDP replicas hold the same shard: only replica 0 writes it
  NamedTensors fixed;   // unsharded parameters (pos_embed), written by rank 0
};

// A frozen model's file the run was trained with (model.autoencoder, model.text_encoders.*): never
// in a checkpoint itself, but named with a digest of its content, so a resume with other files
// is refused (trainer/frozen/frozen_files.h).
struct FrozenFileRecord {
  std::string path;
  std::string content;  // "BYTES CRC32" of a file; a folder's: "NAME BYTES CRC32 …" of each file it holds
};

struct CheckpointContents {
  NamedTensors model;
  NamedTensors ema;        // may be empty
  NamedTensors optimizer;  // exp_avg.<key>, exp_avg_sq.<key>
  NamedTensors rng;        // "cpu" (+ "cuda:<i>")
  NamedTensors fp8;        // delayed scaling's amax histories (models/fp8/convert.h); may be empty
  TrainProgress progress;
  int64_t optimizer_step_count = 0;
  std::string config_yaml;  // the resolved config of the run that wrote it
  // By config key ("model.autoencoder", …). Unset in checkpoints written before they were recorded.
  std::optional<std::map<std::string, FrozenFileRecord>> frozen_files;
  std::optional<ShardedContents> sharded;
  int64_t world_size = 1;
};

// The ranks taking part in a save: all call save_checkpoint together. Each phase of the protocol
// ends with a vote: `all_ok(mine)` returns true when every rank passed true (empty at world 1).
// The trainer votes over a process group of its own (Gloo), never the training group, so a save
// persisting in the background cannot collide with training collectives.
struct SaveGroup {
  int64_t rank = 0;
  std::function<bool(bool)> all_ok;
  // Fault injection (debug.inject.checkpoint_pause): called with the step and the path after the
  // first file of this rank's part of a checkpoint is written. Empty in real runs.
  std::function<void(int64_t step, const std::string& file)> after_first_file;
};

std::string checkpoint_name(int64_t step);  // "step-0000500"

// Writes a checkpoint under `checkpoints_dir` with the commit protocol above; returns its path.
// Each file's size and CRC-32 are taken while it is written (no read-back). A failure on any
// rank (I/O error, disk full) fails the save on every rank with CheckpointError, after rank 0
// removed the partial directory: nothing complete-looking is left behind.
std::string save_checkpoint(const std::string& checkpoints_dir, const CheckpointContents& contents,
                            const SaveGroup& group = {});

// Reads and verifies a checkpoint directory. Throws CheckpointError naming the file on any
// missing, truncated or corrupt part.
// A sharded checkpoint is consolidated: weights and optimizer moments come back per parameter.
CheckpointContents load_checkpoint(const std::string& dir);

// Shard `shard_index` of a sharded checkpoint as written (unit-keyed tensors, `sharded` set).
// Throws CheckpointError if the checkpoint is not sharded.
CheckpointContents load_checkpoint_shard(const std::string& dir, int64_t shard_index);

// Number of shards a checkpoint was written with (1 for an unsharded one).
int64_t checkpoint_num_shards(const std::string& dir);
// The FSDP layout a checkpoint was written with (nullopt for an unsharded one).
std::optional<ShardLayout> load_checkpoint_layout(const std::string& dir);

// Cheap verification (manifest + sizes + CRCs) without loading tensors; returns "" if valid,
// else the reason.
std::string verify_checkpoint(const std::string& dir);

// The manifest of a checkpoint directory, checked for format and version. Throws CheckpointError
// naming the file.
nlohmann::json read_checkpoint_manifest(const std::string& dir);

// The committed checkpoint directories under `checkpoints_dir` (named step-NNNNNNN, not a
// step-N.tmp of an interrupted save), oldest first, as (step, path); unverified. Empty when the
// directory does not exist.
std::vector<std::pair<int64_t, std::string>> committed_checkpoints(const std::string& checkpoints_dir);

// The newest complete, verified checkpoint under `checkpoints_dir`, or nullopt. Invalid ones are
// reported through `warn` and skipped (a corrupt newest checkpoint falls back to the previous).
std::optional<std::string> find_latest_checkpoint(const std::string& checkpoints_dir,
                                                  const std::function<void(const std::string&)>& warn);

// Removes `*.tmp` leftovers of interrupted saves, then all but the newest `keep` complete
// checkpoints (keep = 0: keep all).
void prune_checkpoints(const std::string& checkpoints_dir, int64_t keep);

}  // namespace flowtrain::trainer
