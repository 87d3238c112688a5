#include "trainer/eval/prompt_following.h"

#include "trainer/frozen/frozen_sampling.h"

#include "data/data_error.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/eval/data_set_manifest.h"
#include "trainer/eval/evaluate.h"
#include "trainer/eval/quality.h"
#include "trainer/eval/validation_loss.h"
#include "trainer/eval/evaluator.h"
#include "trainer/eval/judge_cache.h"
#include "trainer/family.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

namespace flowtrain::trainer {

namespace {

// [N, 3, 56, 56] uint8 -> slots [N, 4, 3, 28, 28] float in [0, 1], slot order top_left, top_right,
// bottom_left, bottom_right.
at::Tensor split_slots(const at::Tensor& canvases) {
  TORCH_CHECK(canvases.dim() == 4 && canvases.size(1) == 3 && canvases.size(2) == data::kCompositionSide &&
                  canvases.size(3) == data::kCompositionSide,
              "prompt following: canvases must be [N, 3, 56, 56], got ", canvases.sizes());
  const int64_t N = canvases.size(0), S = data::kSlotSide;
  // [N, 3, 2, 28, 2, 28] -> [N, 2, 2, 3, 28, 28]
  return canvases.to(at::kFloat).div(255.0).reshape({N, 3, 2, S, 2, S}).permute({0, 2, 4, 1, 3, 5}).reshape({N, 4, 3, S, S});
}

}  // namespace

std::vector<CanvasReading> read_canvases(const at::Tensor& canvases, models::FashionClassifier& classifier) {
  const at::Tensor slots = split_slots(canvases);  // [N, 4, 3, S, S]
  const int64_t N = slots.size(0), S = data::kSlotSide;
  const at::Tensor grey = std::get<0>(slots.max(2));  // [N, 4, S, S]
  // A garment is a solid region, sampling noise scattered pixels: a pixel is foreground when it
  // and the mean of its 3×3 neighbourhood both exceed kForeground (GenEval's detector likewise
  // ignores texture that is no object).
  const at::Tensor neighbourhood =
      at::avg_pool2d(grey.reshape({N * 4, 1, S, S}), {3, 3}, {1, 1}, {1, 1}).reshape({N, 4, S, S});
  const at::Tensor foreground = (grey > kForeground).logical_and(neighbourhood > kForeground);
  const at::Tensor counts = foreground.sum({2, 3});  // [N, 4]
  // Mean rgb / grey over the foreground pixels -> nearest palette colour.
  const at::Tensor ratio = slots / grey.unsqueeze(2).clamp_min(1e-6);  // [N, 4, 3, S, S]
  const at::Tensor fg = foreground.unsqueeze(2).to(at::kFloat);
  const at::Tensor mean_ratio = (ratio * fg).sum({3, 4}) / fg.sum({3, 4}).clamp_min(1.0);  // [N, 4, 3]
  const at::Tensor palette = data::composition_colors();                                   // [8, 3]
  const at::Tensor colors = (mean_ratio.unsqueeze(2) - palette.reshape({1, 1, 8, 3})).pow(2).sum(3).argmin(2);
  // Classes from the grey images, in the classifier's [−1, 1] scale.
  const at::Tensor logits =
      models::classify_images(classifier, grey.reshape({N * 4, 1, S, S}).mul(2.0).sub(1.0)).logits;
  const at::Tensor classes = logits.argmax(1).reshape({N, 4});

  std::vector<CanvasReading> out(N);
  auto c = counts.accessor<int64_t, 2>();
  auto k = classes.accessor<int64_t, 2>();
  auto col = colors.accessor<int64_t, 2>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t s = 0; s < 4; ++s) out[i][s] = {c[i][s] < kMinForeground, k[i][s], col[i][s]};
  return out;
}

at::Tensor canvas_features(const at::Tensor& canvases, models::FashionClassifier& classifier) {
  const at::Tensor slots = split_slots(canvases);
  const int64_t N = slots.size(0), S = data::kSlotSide;
  const at::Tensor grey = std::get<0>(slots.max(2));
  const at::Tensor features =
      models::classify_images(classifier, grey.reshape({N * 4, 1, S, S}).mul(2.0).sub(1.0)).features;
  return at::cat({features.reshape({N, 4, -1}).mean(1), slots.mean({3, 4}).reshape({N, 12})}, 1);
}

PromptScores score_readings(const std::vector<CanvasReading>& readings, const std::vector<data::Composition>& prompts) {
  TORCH_CHECK(readings.size() == prompts.size(), "prompt following: ", readings.size(), " readings for ",
              prompts.size(), " prompts");
  PromptScores s;
  int64_t objects = 0, objects_right = 0, class_right = 0, color_right = 0, prompts_right = 0, layout_right = 0,
          heldout_right = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const CanvasReading& r = readings[i];
    std::array<bool, data::kNumSlots> wanted{};
    bool all_right = true;
    for (const auto& o : prompts[i].objects) {
      wanted[o.slot] = true;
      const SlotReading& slot = r[o.slot];
      const bool cls = !slot.empty && slot.class_id == o.class_id, color = !slot.empty && slot.color == o.color;
      ++objects;
      class_right += cls;
      color_right += color;
      objects_right += cls && color;
      all_right = all_right && cls && color;
    }
    bool layout = true;
    for (int64_t slot = 0; slot < data::kNumSlots; ++slot) layout = layout && (wanted[slot] == !r[slot].empty);
    layout_right += layout;
    const bool right = all_right && layout;
    prompts_right += right;
    if (prompts[i].heldout) {
      ++s.num_heldout;
      heldout_right += right;
    }
  }
  s.num = static_cast<int64_t>(prompts.size());
  auto frac = [](int64_t a, int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };
  s.prompt_accuracy = frac(prompts_right, s.num);
  s.object_accuracy = frac(objects_right, objects);
  s.class_accuracy = frac(class_right, objects);
  s.color_accuracy = frac(color_right, objects);
  s.position_accuracy = frac(layout_right, s.num);
  s.heldout_prompt_accuracy = frac(heldout_right, s.num_heldout);
  return s;
}

std::string PromptFollowingReport::to_json() const {
  nlohmann::ordered_json j;
  j["prompt_accuracy"] = scores.prompt_accuracy;
  j["object_accuracy"] = scores.object_accuracy;
  j["class_accuracy"] = scores.class_accuracy;
  j["color_accuracy"] = scores.color_accuracy;
  j["position_accuracy"] = scores.position_accuracy;
  if (scores.num_heldout > 0) j["heldout_prompt_accuracy"] = scores.heldout_prompt_accuracy;
  else j["heldout_prompt_accuracy"] = nullptr;  // no held-out prompt among the first num: not 0, unknown
  j["prompt_accuracy_ceiling"] = prompt_accuracy_ceiling;
  j["fd"] = fd;
  j["fd_floor"] = fd_floor;
  j["num"] = scores.num;
  j["num_heldout"] = scores.num_heldout;
  if (std::isfinite(val_loss)) j["val_loss"] = val_loss;
  if (std::isfinite(prompt_accuracy_ceiling_through_autoencoder)) {
    j["prompt_accuracy_ceiling_through_autoencoder"] = prompt_accuracy_ceiling_through_autoencoder;
    j["class_accuracy_ceiling_through_autoencoder"] = class_accuracy_ceiling_through_autoencoder;
  }
  return j.dump();
}

namespace {

// What the judge needs of the run, before any model is loaded.
void check_judgeable_run(const Config& c) {
  const std::string where = c.source_path.empty() ? std::string("config") : c.source_path;
  // Precomputed embeddings hold the training captions only: there would be nothing to condition
  // the evaluation prompts on.
  if (!reads_caption_tokens(c.model))
    throw ConfigError(fmt::format("{}: prompt following generates the evaluation prompts, which needs a model that "
                                  "reads captions through its own text encoder ('model.text_encoder_layers' > 0)",
                                  where));
  const auto prompts = static_cast<int64_t>(data::load_eval_prompts(c.data.path).size());
  // The Fréchet distance compares eval.num samples with as many training canvases.
  const auto train = manifest_field<int64_t>(c.data.path, "num_train");
  const int64_t most = std::min(prompts, train);
  if (c.eval.num < 2 || c.eval.num > most)
    throw ConfigError(fmt::format("{}: 'eval.num' is {}; it must be in [2, {}] ({} has {} evaluation prompts and {} "
                                  "training canvases)",
                                  where, c.eval.num, most, c.data.path, prompts, train));
}

// The judge and the real side, loaded once per (data set, classifier cache, device).
struct PromptEvalContext {
  TrainedClassifier classifier;
  std::vector<data::Composition> prompts;
  at::Tensor real_eval;  // real canvases of the prompts
  at::Tensor train;      // training canvases
  std::map<int64_t, std::pair<FeatureStats, double>> references;  // N -> (train stats, fd floor)
  std::map<int64_t, double> ceilings;
};

JudgeCache<PromptEvalContext> g_judges;

// The caller holds g_judges.lock().
PromptEvalContext& context_for(const std::string& data_dir, const std::string& classifier_dir,
                               const c10::Device& device) {
  return g_judges.get(data_dir, classifier_dir, device, [&] {
    auto ctx = std::make_unique<PromptEvalContext>();
    ctx->classifier = load_or_train_classifier(classifier_dir, fashion_dir_of(data_dir), device);
    const data::CompositionSet eval = data::load_compositions(data_dir, "eval");
    ctx->prompts = eval.items;
    ctx->real_eval = eval.images;
    // Only as many training canvases as there are prompts are ever compared (the Fréchet
    // distance at N = eval.num): keep those, not the whole set, for the life of the process.
    const at::Tensor train = data::load_compositions(data_dir, "train").images;
    ctx->train = train.narrow(0, 0, std::min<int64_t>(train.size(0), eval.images.size(0))).clone();
    return ctx;
  });
}

}  // namespace

PromptFollowingReport score_prompt_following(const at::Tensor& samples, const std::string& data_dir,
                                             const std::string& classifier_dir, const c10::Device& device) {
  const auto lock = g_judges.lock();
  PromptEvalContext& ctx = context_for(data_dir, classifier_dir, device);
  const int64_t n = samples.size(0);
  if (n > static_cast<int64_t>(ctx.prompts.size()) || n > ctx.train.size(0))
    throw data::DataError(fmt::format("{}: {} samples to score but the set has {} evaluation prompts and {} training "
                                      "canvases (make it with a larger --num-eval)",
                                      data_dir, n, ctx.prompts.size(), ctx.train.size(0)));
  if (n < 2) throw data::DataError("prompt following: needs at least 2 samples");
  auto& classifier = ctx.classifier.model;
  const std::vector<data::Composition> prompts(ctx.prompts.begin(), ctx.prompts.begin() + n);
  PromptFollowingReport report;
  report.scores = score_readings(read_canvases(samples, classifier), prompts);
  auto ref = ctx.references.find(n);
  if (ref == ctx.references.end()) {
    const FeatureStats train = feature_stats(canvas_features(ctx.train.narrow(0, 0, n), classifier));
    const at::Tensor real = ctx.real_eval.narrow(0, 0, n);
    const double floor = frechet_distance(feature_stats(canvas_features(real, classifier)), train);
    ref = ctx.references.emplace(n, std::make_pair(train, floor)).first;
    ctx.ceilings[n] = score_readings(read_canvases(real, classifier), prompts).prompt_accuracy;
  }
  report.fd = frechet_distance(feature_stats(canvas_features(samples, classifier)), ref->second.first);
  report.fd_floor = ref->second.second;
  report.prompt_accuracy_ceiling = ctx.ceilings[n];
  return report;
}

PromptScores score_autoencoder_round_trip(const Config& config, int64_t n, const c10::Device& device) {
  auto lock = g_judges.lock();
  PromptEvalContext& ctx = context_for(config.data.path, config.eval.classifier_dir, device);
  const at::Tensor real = ctx.real_eval.narrow(0, 0, n);
  const std::vector<data::Composition> prompts(ctx.prompts.begin(), ctx.prompts.begin() + n);
  const at::Tensor pixels = real.to(at::kFloat).div(127.5).sub(1.0);  // uint8 -> [−1, 1]
  // In slices: the autoencoder's activations at a few hundred canvases stay small.
  std::vector<at::Tensor> round_trip;
  for (int64_t i = 0; i < n; i += 100) {
    const at::Tensor x = samples_to_pixels(config, pixels_to_model_space(config, pixels.narrow(0, i, std::min<int64_t>(100, n - i))));
    round_trip.push_back(x.clamp(-1.0, 1.0).add(1.0).mul(127.5).round().to(at::kByte));  // as evaluate.cpp quantises samples
  }
  return score_readings(read_canvases(at::cat(round_trip), ctx.classifier.model), prompts);
}

void check_prompt_following_config(const Config& c, const models::DiffusionModel& model) {
  const std::string where = c.source_path.empty() ? std::string("config") : c.source_path;
  const std::vector<int64_t> shape = pixel_sample_shape(c, model.sample_shape());  // decoded, for a latent model
  if (shape != std::vector<int64_t>{3, data::kCompositionSide, data::kCompositionSide})
    throw ConfigError(fmt::format("{}: prompt following judges 3×56×56 canvases; the model makes {}×{}×{} "
                                  "('model.in_channels', 'model.image_size'{})",
                                  where, shape[0], shape[1], shape[2],
                                  c.model.autoencoder.empty() ? "" : ", through model.autoencoder"));
  check_judgeable_run(c);
}

double prompt_held_out_loss(models::DiffusionModel& model, const RowConditioning& eval_rows, const Config& config,
                            const c10::Device& device) {
  auto lock = g_judges.lock();
  const at::Tensor canvases = context_for(config.data.path, config.eval.classifier_dir, device).real_eval;
  lock.unlock();
  return validation_loss(model, canvases, eval_rows(at::arange(canvases.size(0), at::kLong)), config, device,
                         static_cast<uint64_t>(config.eval.seed), "evaluation canvases");
}

PromptFollowingReport evaluate_prompt_following_checkpoint(const Config& config, const std::string& checkpoint_dir,
                                                           int64_t num_override, bool raw) {
  Config c = config;
  if (num_override > 0) c.eval.num = num_override;
  check_judgeable_run(c);  // before a model is loaded
  const CheckpointEvalSamples e =
      generate_checkpoint_eval_samples(c, checkpoint_dir, 0, raw, check_prompt_following_config);
  PromptFollowingReport report = score_prompt_following(e.samples, c.data.path, c.eval.classifier_dir, e.device);
  report.val_loss = prompt_held_out_loss(*e.model, e.eval_rows, c, e.device);
  if (decodes_samples(c)) {
    const PromptScores through = score_autoencoder_round_trip(c, report.scores.num, e.device);
    report.prompt_accuracy_ceiling_through_autoencoder = through.prompt_accuracy;
    report.class_accuracy_ceiling_through_autoencoder = through.class_accuracy;
  }
  write_file_atomic(e.report_path, report.to_json() + "\n");
  return report;
}

namespace {

class PromptFollowingEvaluator : public Evaluator {
 public:
  std::string name() const override { return "prompt following"; }
  void check(const Config& config, const models::DiffusionModel& model) const override {
    check_prompt_following_config(config, model);
  }
  EvalScores score(const at::Tensor& samples, const models::DiffusionModel&, const Config& config,
                   const c10::Device& device) const override {
    const PromptFollowingReport p = score_prompt_following(samples, config.data.path, config.eval.classifier_dir, device);
    EvalScores s;
    s.metrics = {{"eval_prompt_accuracy", p.scores.prompt_accuracy},
                 {"eval_heldout_prompt_accuracy", p.scores.heldout_prompt_accuracy},
                 {"eval_object_accuracy", p.scores.object_accuracy},
                 {"eval_class_accuracy", p.scores.class_accuracy},
                 {"eval_color_accuracy", p.scores.color_accuracy},
                 {"eval_position_accuracy", p.scores.position_accuracy},
                 {"eval_fd", p.fd}};
    s.summary = fmt::format(
        "prompt accuracy {:.1f}% (held-out pairs {:.1f}%, judge's ceiling {:.1f}%) | objects {:.1f}% | class {:.1f}% "
        "| colour {:.1f}% | position {:.1f}% | FD {:.3f} (floor {:.3f})",
        100 * p.scores.prompt_accuracy, 100 * p.scores.heldout_prompt_accuracy, 100 * p.prompt_accuracy_ceiling,
        100 * p.scores.object_accuracy, 100 * p.scores.class_accuracy, 100 * p.scores.color_accuracy,
        100 * p.scores.position_accuracy, p.fd, p.fd_floor);
    s.num = p.scores.num;
    s.unit = "prompts";
    return s;
  }
  std::string evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override,
                                  bool raw) const override {
    return evaluate_prompt_following_checkpoint(config, checkpoint_dir, num_override, raw).to_json();
  }
};

}  // namespace

std::unique_ptr<Evaluator> make_prompt_following_evaluator() { return std::make_unique<PromptFollowingEvaluator>(); }

}  // namespace flowtrain::trainer
