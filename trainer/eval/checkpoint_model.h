// The model of a checkpoint, ready to sample from: what `flowtrain sample` and `flowtrain eval`
// both need (built by its family, the EMA weights unless absent or not wanted, on the device).
#pragma once

#include "models/model.h"
#include "trainer/config/config.h"
#include "trainer/family.h"
#include "trainer/run_conditioning.h"

#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace flowtrain::trainer {

struct CheckpointModel {
  std::shared_ptr<models::DiffusionModel> model;  // in eval mode, on the device
  RunConditioning conditioning;  // of the config's family and data set (no training rows)
  bool ema = false;  // which weights were loaded
  int64_t step = 0;  // the checkpoint's step
  // Where `flowtrain eval` writes its report: <checkpoint>/eval.json, or eval-raw.json when the
  // raw weights were asked for, so scoring both never overwrites one with the other.
  std::string report_path;
};

// Builds config.model's family, checks it can be conditioned on this data set (before reading
// the checkpoint), loads the checkpoint's EMA weights — the raw ones when it has no EMA or
// `raw` is set — strictly (names and shapes; errors name the file) and moves the model to `device`.
CheckpointModel load_checkpoint_model(const Config& config, const std::string& checkpoint_dir, bool raw,
                                      const c10::Device& device);

}  // namespace flowtrain::trainer
