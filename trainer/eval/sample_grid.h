// Class-conditional sample grids: what training writes every sample.every steps and what
// `flowtrain sample` writes from a checkpoint.
#pragma once

#include "models/dit/dit.h"
#include "models/flow_matching.h"
#include "trainer/config/config.h"

#include <string>

namespace flowtrain::trainer {

// Rows [first, first + count) of a fixed draw `all` (count < 0: every row). Rows past the end
// repeat the last one: the padding that lets N rows split evenly over ranks, which every rank
// then computes in the same number of same-sized batches.
at::Tensor padded_rows(const at::Tensor& all, int64_t first, int64_t count);

// Rows [first, first + count) of the grid (count < 0: all sample.num): image i of class
// i % num_classes, from noise drawn with sample.seed (the same noise at every call, so grids over
// training are comparable), integrated with `velocity` — the caller sets eval mode / no-grad
// (TrainState::with_sampling_model). Returns [count, C, H, W] in [−1, 1] on the CPU.
at::Tensor generate_samples(const models::VelocityFn& velocity, const models::DiTOptions& model,
                            const SampleConfig& sample, const FlowConfig& flow, int64_t num_classes,
                            const c10::Device& device, int64_t first = 0, int64_t count = -1);
// The whole grid from a model as it is (`flowtrain sample`): eval mode and no-grad around it.
at::Tensor generate_samples(models::DiT& model, const SampleConfig& sample, const FlowConfig& flow,
                            int64_t num_classes, const c10::Device& device);

// Lays samples out with one class per column (num_classes columns): uint8 [H, W] or [H, W, 3].
at::Tensor sample_grid_image(const at::Tensor& samples, int64_t num_classes);
// The same grid written as a PNG, atomically.
void write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t num_classes);

}  // namespace flowtrain::trainer
