// Prompt following on Fashion compositions, GenEval-style (Ghosh et al. 2023) with a fixed layout:
// detection becomes a per-slot reading of each generated 56×56 canvas, judged against the
// prompt's ground truth (data/compositions.h).
//
// Reading a 28×28 slot: its grey image is the brightest channel (every palette colour has a
// component of 1, so that channel is the garment's grey value); a pixel is foreground when it and
// its 3×3 neighbourhood's mean exceed kForeground (isolated bright pixels are noise, not garment);
// the slot is empty when it has fewer than kMinForeground foreground pixels; the class is the project's Fashion-MNIST
// classifier's argmax on the grey image; the colour is the palette entry nearest (L2) to the mean
// of rgb / grey over the foreground pixels.
//
//   prompt_accuracy          prompts with every object right in class, colour and slot and the
//                            other slots empty
//   object_accuracy          objects whose slot holds the right class in the right colour
//   class_accuracy           objects whose slot holds the right class (any colour)
//   color_accuracy           objects whose slot holds the right colour (any class)
//   position_accuracy        prompts whose occupied slots are exactly the prompt's slots
//   heldout_prompt_accuracy  prompt_accuracy over the prompts with a held-out (class, colour) pair
//   prompt_accuracy_ceiling  prompt_accuracy of the real canvases of the same prompts: the judge's
//                            own errors cap every score
//   fd, fd_floor             Fréchet distance of canvas features (the classifier's features of
//                            each slot, averaged, and each slot's mean colour) between the samples
//                            and training canvases, and between the prompts' real canvases and
//                            those training canvases (the floor at this N)
#pragma once

#include "data/compositions.h"
#include "models/classifier.h"
#include "models/model.h"
#include "trainer/config/config.h"
#include "trainer/eval/sample_grid.h"

#include <c10/core/Device.h>

#include <ATen/ATen.h>

#include <array>
#include <limits>
#include <string>
#include <vector>

namespace flowtrain::trainer {

inline constexpr double kForeground = 0.2;      // grey level (of 1) above which a pixel is garment
inline constexpr int64_t kMinForeground = 12;   // foreground pixels below which a slot is empty

struct SlotReading {
  bool empty = true;
  int64_t class_id = -1, color = -1;
};
using CanvasReading = std::array<SlotReading, data::kNumSlots>;

// canvases uint8 [N, 3, 56, 56] -> one reading per canvas.
std::vector<CanvasReading> read_canvases(const at::Tensor& canvases, models::FashionClassifier& classifier);
// Canvas features for the Fréchet distance: [N, 256 + 12] float.
at::Tensor canvas_features(const at::Tensor& canvases, models::FashionClassifier& classifier);

struct PromptScores {
  double prompt_accuracy = 0, object_accuracy = 0, class_accuracy = 0, color_accuracy = 0, position_accuracy = 0,
         heldout_prompt_accuracy = 0;
  int64_t num = 0, num_heldout = 0;
};
// Pure: readings against the prompts (the same length).
PromptScores score_readings(const std::vector<CanvasReading>& readings, const std::vector<data::Composition>& prompts);

struct PromptFollowingReport {
  PromptScores scores;
  double prompt_accuracy_ceiling = 0, fd = 0, fd_floor = 0;
  // A latent run (model.autoencoder): the judge on the real canvases after a round trip through the
  // autoencoder (encoded, decoded) — the most a latent model's samples could score; NaN otherwise.
  double prompt_accuracy_ceiling_through_autoencoder = std::numeric_limits<double>::quiet_NaN();
  double class_accuracy_ceiling_through_autoencoder = std::numeric_limits<double>::quiet_NaN();
  // The flow-matching loss on every evaluation prompt's real canvas (trainer/eval/
  // validation_loss.h); NaN when not measured (then left out of the JSON).
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  // {"prompt_accuracy":…,"object_accuracy":…,"class_accuracy":…,"color_accuracy":…,
  //  "position_accuracy":…,"heldout_prompt_accuracy":…,"prompt_accuracy_ceiling":…,"fd":…,
  //  "fd_floor":…,"num":…,"num_heldout":…,"val_loss":…} (+ the two *_through_autoencoder
  //  ceilings of a latent run)
  std::string to_json() const;
};

// Scores samples of the first N evaluation prompts of the compositions set in `data_dir`
// (samples uint8 [N, 3, 56, 56], sample i of prompt i). The classifier is the cached one of the
// Fashion-MNIST directory the set was made from (its manifest), trained on first use.
PromptFollowingReport score_prompt_following(const at::Tensor& samples, const std::string& data_dir,
                                             const std::string& classifier_dir, const c10::Device& device);

// The judge on the first `n` evaluation canvases after a round trip through the run's
// autoencoder (config.model.autoencoder: encoded to its scaled latent means, decoded).
PromptScores score_autoencoder_round_trip(const Config& config, int64_t n, const c10::Device& device);

// Throws ConfigError naming the key when a run cannot be judged on prompt following: the model
// must make 3 × 56 × 56 canvases and eval.num must be in [2, evaluation prompts].
void check_prompt_following_config(const Config& config, const models::DiffusionModel& model);

// The held-out flow-matching loss of `model` on all evaluation prompts of the set in `data_dir`
// (their real canvases, conditioned by `eval_rows` of the prompt indices), noise and times from
// eval.seed: every run of a config is measured on the same canvases, times and noise.
double prompt_held_out_loss(models::DiffusionModel& model, const RowConditioning& eval_rows, const Config& config,
                            const c10::Device& device);

// `flowtrain eval` of a text-to-image checkpoint: its EMA weights (raw without EMA or with `raw`)
// generate the first eval.num (num_override > 0: that many) evaluation prompts with the eval
// section's sampler, scored as above, plus the held-out loss (all prompts, whatever eval.num);
// the report is written atomically to CheckpointModel::report_path.
PromptFollowingReport evaluate_prompt_following_checkpoint(const Config& config, const std::string& checkpoint_dir,
                                                           int64_t num_override = 0, bool raw = false);

}  // namespace flowtrain::trainer
