// Stage 1 of an asynchronous save: this rank's checkpoint tensors copied into host buffers that
// belong to the stager, so the step after the save may overwrite weights, moments and EMA while
// the copies are persisted in the background.
//
// The buffers are allocated at the first save and reused by every later one (a state's shapes do
// not change during a run): staging is then a copy, never an allocation. On CUDA they are pinned
// and the device-to-host copies are issued asynchronously; wait() blocks until they are done.
// The price is host memory: one more copy of this rank's training state (its shard, under FSDP).
#pragma once

#include "trainer/checkpoint/checkpoint.h"

#include <map>
#include <string>

namespace flowtrain::trainer {

class CheckpointStager {
 public:
  // Copies every tensor of `contents` into this stager's buffers and returns the same contents
  // referring to the buffers. The returned tensors stay valid until the next stage() call.
  CheckpointContents stage(const CheckpointContents& contents);
  // Blocks until the copies issued by the last stage() have landed (a no-op for CPU sources).
  void wait();
  // Bytes held in staging buffers (allocated once, reused).
  int64_t buffer_bytes() const;

 private:
  NamedTensors stage_tensors(const std::string& kind, const NamedTensors& tensors);

  std::map<std::string, at::Tensor> buffers_;  // "<kind>/<name>" → host buffer
  c10::DeviceIndex cuda_device_ = -1;  // the device whose copies are in flight, -1 when none
};

}  // namespace flowtrain::trainer
