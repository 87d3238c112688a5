// Stage 1 of an asynchronous save: this rank's checkpoint tensors copied into host buffers that
// belong to the stager, so the steps after the save may overwrite weights, moments and EMA while
// the copies are persisted in the background.
//
// The buffers are allocated once — by reserve() at the start of a run, or else at the first save —
// and reused by every later save (a state's shapes do not change during a run): staging is then a
// copy, never an allocation. The price is host memory: one more copy of this rank's training
// state (its shard, under FSDP).
//
// CPU tensors are copied before stage() returns. CUDA tensors are copied into pinned buffers on a
// side stream, after the work the current stream has queued (the step that produced them), and
// stage() returns at once: the next forward and backward run while the copies do, since they
// only read the state. Two waits remain, both on the copies' event:
//   - before_state_update(): the current stream waits (the host does not) — call it before the
//     optimizer step and the EMA update, which overwrite what is being copied;
//   - wait(): the calling thread blocks — the persist thread calls it before reading the buffers.
// (The CUDA path compiles on every build through c10's device-generic stream and event API; it
// has not run on a GPU yet.)
#pragma once

#include "trainer/checkpoint/checkpoint.h"

#include <c10/core/Event.h>

#include <map>
#include <optional>
#include <string>

namespace flowtrain::trainer {

class CheckpointStager {
 public:
  // Issues the copies of every tensor of `contents` into this stager's buffers and returns the
  // same contents referring to the buffers, valid until the next stage() call.
  CheckpointContents stage(const CheckpointContents& contents);
  // Allocates and first-touches the buffers a stage() of contents with these shapes will use,
  // copying nothing. Allocating and faulting in gigabytes of host memory is what made a first
  // save slow (a 7 GB state: 4.5 s blocked, later saves 0.25 s; docs/checkpoints.md), so a run
  // pays it here, once, before its first step.
  void reserve(const CheckpointContents& contents);
  // CUDA: the device's current stream waits for the staging copies. A no-op after CPU staging.
  void before_state_update();
  // Blocks until the staging copies have landed. A no-op after CPU staging.
  void wait();
  // Bytes held in staging buffers (allocated once, reused).
  int64_t buffer_bytes() const;

 private:
  NamedTensors stage_tensors(const std::string& kind, const NamedTensors& tensors);
  // The buffer for `source` under `key`, allocated when missing (or of another shape); `fresh`
  // says whether it was.
  at::Tensor& buffer_for(const std::string& key, const at::Tensor& source, bool* fresh = nullptr);

  std::map<std::string, at::Tensor> buffers_;  // "<kind>/<name>" → host buffer
  std::optional<c10::Stream> side_stream_;     // CUDA: where the device-to-host copies run
  std::optional<c10::Event> copied_;           // CUDA: recorded after the last stage()'s copies
};

}  // namespace flowtrain::trainer
