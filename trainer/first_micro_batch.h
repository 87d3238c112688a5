// The trainer's first micro-batch of a config, outside a training run: the same loader, data
// set, conditioning and flow-matching draws as Trainer::train_step at step 0 on one rank. Used by
// `flowtrain bench --parity-dump` (the PyTorch peer replays it) and `flowtrain numerics`.
#pragma once

#include "models/flow_matching.h"
#include "models/model.h"
#include "trainer/config/config.h"

namespace flowtrain::trainer {

struct FirstMicroBatch {
  at::Tensor x0;                   // clean samples [B/grad_accum, C, (T,) H, W], CPU
  models::FlowMatchingDraw draw;   // t, noise and the conditioning after CFG dropout
};
FirstMicroBatch first_micro_batch(const Config& config, const models::DiffusionModel& model);

}  // namespace flowtrain::trainer
