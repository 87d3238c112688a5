// Class-conditional sample grids: what training writes every sample.every steps and what
// `flowtrain sample` writes from a checkpoint.
#pragma once

#include "models/dit.h"
#include "trainer/config.h"

#include <string>

namespace flowtrain::trainer {

// num images, image i of class i % num_classes, from noise drawn with sample.seed (the same
// noise at every call, so grids over training are comparable). Returns [num, C, H, W] in [−1, 1].
at::Tensor generate_samples(models::DiT& model, const SampleConfig& sample, const FlowConfig& flow,
                            int64_t num_classes, const c10::Device& device);

// Lays samples out with one class per column (num_classes columns): uint8 [H, W] or [H, W, 3].
at::Tensor sample_grid_image(const at::Tensor& samples, int64_t num_classes);
// The same grid written as a PNG, atomically.
void write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t num_classes);

}  // namespace flowtrain::trainer
