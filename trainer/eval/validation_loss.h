// The flow-matching loss on held-out images with every random input fixed: a deterministic,
// low-noise measure of fit for comparing runs of one config (two logged one-batch training
// losses differ by more than many of the effects being compared). SD3 (Esser et al. 2024, §5.1)
// reports the same kind of validation loss, at equally spaced timesteps, and finds it tracks
// sample quality.
#pragma once

#include "models/conditioning.h"
#include "models/model.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <string>

namespace flowtrain::trainer {

// mean((v(x_t, t) − (ε − x0))²) over rows and elements of x0 = `images_u8` ([N, C, H, W]
// uint8, as the loader prepares them: data::model_input_images), conditioned by `conditioning`
// (N rows, no dropout), with t_i = (i + 0.5) / N through the run's time shift and ε drawn from
// `seed`. `model` as it is (eval mode and no-grad set here, its mode restored; under autocast
// when train.precision is bf16, as training's forward). Batched; the result does not depend on
// the batching beyond fp32 summation order. Logs the result and its time, naming the images
// `what` ("test images").
double validation_loss(models::DiffusionModel& model, const at::Tensor& images_u8,
                       const models::Conditioning& conditioning, const Config& config, const c10::Device& device,
                       uint64_t seed, const std::string& what = "held-out images");

}  // namespace flowtrain::trainer
