// Class-conditional sample grids: what training writes every sample.every steps and what
// `flowtrain sample` writes from a checkpoint.
#pragma once

#include "models/model.h"
#include "models/flow_matching.h"
#include "trainer/config/config.h"

#include <functional>
#include <string>

namespace flowtrain::trainer {

// Rows [first, first + count) of a fixed draw `all` (count < 0: every row). Rows past the end
// repeat the last one: the padding that lets N rows split evenly over ranks, which every rank
// then computes in the same number of same-sized batches.
at::Tensor padded_rows(const at::Tensor& all, int64_t first, int64_t count);

// How a class id conditions the model (ModelFamily::class_conditioning).
using ClassConditioning = std::function<models::Conditioning(const at::Tensor& labels)>;

// The sampler settings of a grid or an evaluation (sampler name, steps, CFG scale, flow.shift).
models::SamplerOptions sampler_options(const std::string& sampler, int64_t steps, double cfg_scale,
                                       const FlowConfig& flow);

// Class-conditional samples of `model`: rows [first, first + count) of a fixed draw of `num`
// noises from `seed`, row i of class i % num_classes, integrated with `velocity` (the caller sets
// eval mode / no-grad: TrainState::with_sampling_model) under classifier-free guidance against
// the model's null conditioning. count < 0: all rows. Returns [count, C, H, W] on the CPU.
at::Tensor sample_classes(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                          const ClassConditioning& conditioning, int64_t num, int64_t seed, int64_t num_classes,
                          const models::SamplerOptions& options, const c10::Device& device, int64_t first = 0,
                          int64_t count = -1);

// The sample grid (sample.*): image i of class i % num_classes, from noise drawn with
// sample.seed (the same noise at every call, so grids over training are comparable), in [−1, 1].
at::Tensor generate_samples(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                            const ClassConditioning& conditioning, const SampleConfig& sample, const FlowConfig& flow,
                            int64_t num_classes, const c10::Device& device, int64_t first = 0, int64_t count = -1);

// Lays samples out with one class per column (num_classes columns): uint8 [H, W] or [H, W, 3].
at::Tensor sample_grid_image(const at::Tensor& samples, int64_t num_classes);
// The same grid written as a PNG, atomically.
void write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t num_classes);

}  // namespace flowtrain::trainer
