// Sample grids: what training writes every sample.every steps and what `flowtrain sample` writes
// from a checkpoint; and the row sampler evaluations share.
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

// The conditioning of generated rows (int64 [n]): class i % K, prompt i, … (RunConditioning::of_rows).
using RowConditioning = std::function<models::Conditioning(const at::Tensor& rows)>;

// The sampler settings of a grid or an evaluation (sampler name, steps, CFG scale, the run's
// time shift: builders.h time_shift).
models::SamplerOptions sampler_options(models::SamplerKind sampler, int64_t steps, double cfg_scale, double shift);

// The fixed draw of `num` noises from `seed` (CPU) that sample_rows integrates: [num, C, H, W].
at::Tensor sample_noise(const models::DiffusionModel& model, int64_t num, int64_t seed);

// Samples of `model`: rows [first, first + count) of a fixed draw of `num` noises from `seed`,
// row i conditioned on conditioning(i), integrated with `velocity` (the caller sets eval mode /
// no-grad: TrainState::with_sampling_model) under classifier-free guidance against the model's
// null conditioning. count < 0: all rows. Returns [count, C, H, W] on the CPU.
at::Tensor sample_rows(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                       const RowConditioning& conditioning, int64_t num, int64_t seed,
                       const models::SamplerOptions& options, const c10::Device& device, int64_t first = 0,
                       int64_t count = -1);

// The sample grid (sample.* of `config`): image i conditioned on row i, from noise drawn with
// sample.seed (the same noise at every call, so grids over training are comparable), in [−1, 1].
at::Tensor generate_samples(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                            const RowConditioning& conditioning, const Config& config, const c10::Device& device,
                            int64_t first = 0, int64_t count = -1);

// Lays samples out `columns` to a row (one class per column for class grids): uint8 [H, W] or [H, W, 3].
// Clips [N, C, T, H, W] are laid out one a row, frame by frame (a frame strip; `columns` unused).
at::Tensor sample_grid_image(const at::Tensor& samples, int64_t columns);
// The frame rate generated clips are played at: the one the training clips were decoded at
// (data.video.fps, rounded), else kDefaultSampleFps (make-moving-fashion's rate).
constexpr int64_t kDefaultSampleFps = 8;
int64_t sample_video_fps(const Config& config);
// The same grid written as a PNG, atomically; for clips also one lossless MP4 per clip at
// `video_fps` in the directory beside it named after it (…/step-0001000.png ->
// …/step-0001000/00000.mp4), where this build has FFmpeg. Returns the grid image.
at::Tensor write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t columns,
                             int64_t video_fps = kDefaultSampleFps);
// Clips [N, C, T, H, W] in [−1, 1] as DIR/00000.mp4 … (DIR: grid_path without its extension);
// returns the paths.
std::vector<std::string> write_sample_videos(const std::string& grid_path, const at::Tensor& clips, int64_t fps);

}  // namespace flowtrain::trainer
