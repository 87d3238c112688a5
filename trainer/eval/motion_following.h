// Motion following on moving-fashion clips (data/shards/pack.h make_moving_fashion): does a
// generated clip show the prompt's garment, in the prompt's colour, moving the prompt's way?
//
// Reading a clip [T, 3, H, W] (uint8), frame by frame as the compositions judge reads a slot: the
// grey image is the brightest channel; a pixel is foreground when it and its 3×3 neighbourhood's
// mean exceed kForeground; a frame with fewer than kMinForeground such pixels is empty. Per
// non-empty frame: the foreground centroid, and the class of the 16×16 window centred on the
// foreground's bounding box (the size a garment is drawn at), scaled to 28×28 for the project's
// Fashion-MNIST classifier — trained on garments seen the same way (classifier_cache.h,
// images_seen_at 16), not on crisp 28×28 images. Per clip: the class is the majority over frames, the colour the
// palette entry nearest the mean rgb / grey over all foreground pixels, the direction the
// dominant axis and sign of the centroid's least-squares velocity (x: right/left, y: down/up).
//
//   prompt_accuracy        clips with class, colour and direction all right
//   class_accuracy, color_accuracy, direction_accuracy   each on its own
//   temporal_consistency   mean over clips of the fraction of non-empty frames whose class is
//                          the clip's majority class (a garment that morphs scores low)
//   prompt_accuracy_ceiling  the same judge on the real clips of the evaluation prompts (and
//   class_/color_/direction_accuracy_ceiling, field by field: where the judge itself errs)
#pragma once

#include "models/model.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// The four directions in make_moving_fashion's order (data::moving_direction_names()).
enum MotionDirection : int64_t { kLeft = 0, kRight = 1, kUp = 2, kDown = 3 };
// "left" -> kLeft …; -1 for another name.
int64_t parse_motion_direction(const std::string& name);

struct MotionPrompt {
  std::string caption;
  int64_t class_id = -1, color = -1, direction = -1;
};

struct ClipReading {
  bool empty = true;  // no frame had a garment
  int64_t class_id = -1, color = -1, direction = -1;
  double temporal_consistency = 0;  // of the non-empty frames, the share in the majority class
};

// Classes of grey 28×28 crops [M, 1, 28, 28] in [−1, 1] -> int64 [M] (the classifier's argmax).
using CropClassifier = std::function<at::Tensor(const at::Tensor& crops)>;

// clips uint8 [N, T, 3, H, W] -> one reading per clip.
std::vector<ClipReading> read_clips(const at::Tensor& clips, const CropClassifier& classify);

struct MotionScores {
  double prompt_accuracy = 0, class_accuracy = 0, color_accuracy = 0, direction_accuracy = 0,
         temporal_consistency = 0;
  int64_t num = 0;
};
// Pure: readings against the prompts (the same length).
MotionScores score_clip_readings(const std::vector<ClipReading>& readings, const std::vector<MotionPrompt>& prompts);

struct MotionFollowingReport {
  MotionScores scores;
  MotionScores ceiling;  // the judge on the real clips of the same prompts
  // {"prompt_accuracy":…,"class_accuracy":…,"color_accuracy":…,"direction_accuracy":…,
  //  "temporal_consistency":…,"prompt_accuracy_ceiling":…,"class_accuracy_ceiling":…,
  //  "color_accuracy_ceiling":…,"direction_accuracy_ceiling":…,"num":…}
  std::string to_json() const;
};

// The evaluation prompts of a moving-fashion set (DIR/eval_prompts.jsonl). Throws DataError naming
// the file and line.
std::vector<MotionPrompt> load_motion_prompts(const std::string& data_dir);

// Scores samples of the first N evaluation prompts of the moving-fashion set in `data_dir`
// (samples uint8 [N, C, T, H, W], the model's layout; sample i of prompt i) with the cached
// classifier of the Fashion-MNIST directory the set was made from (its manifest), trained on first
// use; the ceiling reads the set's real clips of the same prompts.
MotionFollowingReport score_motion_following(const at::Tensor& samples, const std::string& data_dir,
                                             const std::string& classifier_dir, const c10::Device& device);

// Throws ConfigError naming the key when the run cannot be judged: clips of 3 × 32 × 32 frames,
// the built-in text encoder, eval.num in [1, evaluation prompts].
void check_motion_following_config(const Config& config, const models::DiffusionModel& model);

// `flowtrain eval` of a video checkpoint: its EMA weights (raw without EMA or with `raw`) generate
// the first eval.num (num_override > 0: that many) evaluation prompts, scored as above; the report
// is written atomically to CheckpointModel::report_path.
MotionFollowingReport evaluate_motion_following_checkpoint(const Config& config, const std::string& checkpoint_dir,
                                                           int64_t num_override = 0, bool raw = false);

}  // namespace flowtrain::trainer
