#include "trainer/eval/motion_following.h"

#include "data/compositions.h"
#include "data/data_error.h"
#include "data/safetensors.h"
#include "data/shards/pack.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/eval/data_set_manifest.h"
#include "trainer/eval/evaluate.h"
#include "trainer/eval/prompt_following.h"  // kForeground, kMinForeground: one rule for what is garment
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

constexpr int64_t kGarmentSide = data::kMovingGarmentSide;  // the side make_moving_fashion draws garments at
constexpr int64_t kClassifierSide = 28;

// Least-squares slope of v over the frame indices t (at least two points).
double slope(const std::vector<double>& t, const std::vector<double>& v) {
  const double n = double(t.size());
  double mt = 0, mv = 0;
  for (size_t i = 0; i < t.size(); ++i) mt += t[i] / n, mv += v[i] / n;
  double num = 0, den = 0;
  for (size_t i = 0; i < t.size(); ++i) num += (t[i] - mt) * (v[i] - mv), den += (t[i] - mt) * (t[i] - mt);
  return den > 0 ? num / den : 0.0;
}

}  // namespace

int64_t parse_motion_direction(const std::string& name) {
  const auto& names = data::moving_direction_names();
  const auto it = std::find(names.begin(), names.end(), name);
  return it == names.end() ? -1 : static_cast<int64_t>(it - names.begin());
}

std::vector<ClipReading> read_clips(const at::Tensor& clips, const CropClassifier& classify) {
  TORCH_CHECK(clips.dim() == 5 && clips.size(2) == 3 && clips.size(3) >= kGarmentSide && clips.size(4) >= kGarmentSide,
              "motion following: clips must be uint8 [N, T, 3, H, W] with H, W >= 16, got ", clips.sizes());
  const int64_t N = clips.size(0), T = clips.size(1), H = clips.size(3), W = clips.size(4);
  const at::Tensor rgb = clips.to(at::kFloat).div(255.0);  // [N, T, 3, H, W]
  const at::Tensor grey = std::get<0>(rgb.max(2));         // [N, T, H, W]
  const at::Tensor neighbourhood =
      at::avg_pool2d(grey.reshape({N * T, 1, H, W}), {3, 3}, {1, 1}, {1, 1}).reshape({N, T, H, W});
  const at::Tensor foreground = (grey > kForeground).logical_and(neighbourhood > kForeground);
  const at::Tensor fg = foreground.to(at::kFloat);
  const at::Tensor counts = foreground.sum({2, 3});  // [N, T]
  const at::Tensor area = counts.to(at::kFloat).clamp_min(1.0);
  const at::Tensor ys = at::arange(H, at::kFloat).view({1, 1, H, 1}), xs = at::arange(W, at::kFloat).view({1, 1, 1, W});
  const at::Tensor cy = (fg * ys).sum({2, 3}) / area, cx = (fg * xs).sum({2, 3}) / area;  // centroids [N, T]
  // Bounding box of the foreground: first and last occupied row / column.
  const at::Tensor rows = foreground.any(3).to(at::kInt), cols = foreground.any(2).to(at::kInt);  // [N, T, H], [N, T, W]
  const at::Tensor top = rows.argmax(2), bottom = (H - 1) - rows.flip({2}).argmax(2);
  const at::Tensor left = cols.argmax(2), right = (W - 1) - cols.flip({2}).argmax(2);

  // The 16×16 window centred on each non-empty frame's box, scaled to 28×28 in [−1, 1].
  auto c = counts.accessor<int64_t, 2>();
  auto tp = top.accessor<int64_t, 2>(), bt = bottom.accessor<int64_t, 2>();
  auto lf = left.accessor<int64_t, 2>(), rt = right.accessor<int64_t, 2>();
  std::vector<at::Tensor> crops;
  std::vector<std::pair<int64_t, int64_t>> crop_frame;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < T; ++t) {
      if (c[n][t] < kMinForeground) continue;
      const double centre_y = 0.5 * double(tp[n][t] + bt[n][t]), centre_x = 0.5 * double(lf[n][t] + rt[n][t]);
      const int64_t y0 = std::clamp<int64_t>(std::llround(centre_y - 0.5 * (kGarmentSide - 1)), 0, H - kGarmentSide);
      const int64_t x0 = std::clamp<int64_t>(std::llround(centre_x - 0.5 * (kGarmentSide - 1)), 0, W - kGarmentSide);
      crops.push_back(grey[n][t].narrow(0, y0, kGarmentSide).narrow(1, x0, kGarmentSide));
      crop_frame.emplace_back(n, t);
    }
  std::vector<int64_t> frame_class(static_cast<size_t>(N * T), -1);
  if (!crops.empty()) {
    const at::Tensor batch = at::stack(crops).unsqueeze(1);  // [M, 1, 16, 16]
    const at::Tensor scaled =
        at::upsample_bilinear2d(batch, {kClassifierSide, kClassifierSide}, /*align_corners=*/false).clamp(0, 1);
    const at::Tensor classes = classify(scaled.mul(2.0).sub(1.0)).to(at::kLong).contiguous();
    TORCH_CHECK(classes.numel() == static_cast<int64_t>(crops.size()), "motion following: the classifier returned ",
                classes.numel(), " classes for ", crops.size(), " crops");
    auto k = classes.accessor<int64_t, 1>();
    for (size_t i = 0; i < crop_frame.size(); ++i)
      frame_class[static_cast<size_t>(crop_frame[i].first * T + crop_frame[i].second)] = k[static_cast<int64_t>(i)];
  }

  // Colour over every foreground pixel of the clip.
  const at::Tensor ratio = rgb / grey.unsqueeze(2).clamp_min(1e-6);
  const at::Tensor fg3 = fg.unsqueeze(2);
  const at::Tensor mean_ratio = (ratio * fg3).sum({1, 3, 4}) / fg3.sum({1, 3, 4}).clamp_min(1.0);  // [N, 3]
  const at::Tensor palette = data::composition_colors();
  const at::Tensor colors = (mean_ratio.unsqueeze(1) - palette.unsqueeze(0)).pow(2).sum(2).argmin(1);  // [N]

  auto ya = cy.accessor<float, 2>(), xa = cx.accessor<float, 2>();
  auto col = colors.accessor<int64_t, 1>();
  std::vector<ClipReading> out(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    ClipReading& r = out[static_cast<size_t>(n)];
    std::vector<double> ts, px, py;
    std::map<int64_t, int64_t> votes;
    for (int64_t t = 0; t < T; ++t) {
      if (c[n][t] < kMinForeground) continue;
      ts.push_back(double(t));
      px.push_back(xa[n][t]);
      py.push_back(ya[n][t]);
      ++votes[frame_class[static_cast<size_t>(n * T + t)]];
    }
    if (ts.empty()) continue;
    r.empty = false;
    r.color = col[n];
    // Majority class; ties go to the lower class id (std::map order), deterministically.
    int64_t best = -1, best_votes = 0;
    for (const auto& [cls, v] : votes)
      if (v > best_votes) best = cls, best_votes = v;
    r.class_id = best;
    r.temporal_consistency = double(best_votes) / double(ts.size());
    if (ts.size() >= 2) {
      const double vx = slope(ts, px), vy = slope(ts, py);
      if (vx != 0 || vy != 0)
        r.direction = std::abs(vx) >= std::abs(vy) ? (vx > 0 ? kRight : kLeft) : (vy > 0 ? kDown : kUp);
    }
  }
  return out;
}

MotionScores score_clip_readings(const std::vector<ClipReading>& readings, const std::vector<MotionPrompt>& prompts) {
  TORCH_CHECK(readings.size() == prompts.size(), "motion following: ", readings.size(), " readings for ",
              prompts.size(), " prompts");
  MotionScores s;
  s.num = static_cast<int64_t>(prompts.size());
  if (s.num == 0) return s;
  int64_t right = 0, cls = 0, color = 0, direction = 0;
  double consistency = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const ClipReading& r = readings[i];
    const MotionPrompt& p = prompts[i];
    const bool c = !r.empty && r.class_id == p.class_id, k = !r.empty && r.color == p.color,
               d = !r.empty && r.direction == p.direction;
    cls += c;
    color += k;
    direction += d;
    right += c && k && d;
    consistency += r.temporal_consistency;
  }
  const double n = double(s.num);
  s.prompt_accuracy = double(right) / n;
  s.class_accuracy = double(cls) / n;
  s.color_accuracy = double(color) / n;
  s.direction_accuracy = double(direction) / n;
  s.temporal_consistency = consistency / n;
  return s;
}

std::string MotionFollowingReport::to_json() const {
  nlohmann::ordered_json j;
  j["prompt_accuracy"] = scores.prompt_accuracy;
  j["class_accuracy"] = scores.class_accuracy;
  j["color_accuracy"] = scores.color_accuracy;
  j["direction_accuracy"] = scores.direction_accuracy;
  j["temporal_consistency"] = scores.temporal_consistency;
  j["prompt_accuracy_ceiling"] = ceiling.prompt_accuracy;
  j["class_accuracy_ceiling"] = ceiling.class_accuracy;
  j["color_accuracy_ceiling"] = ceiling.color_accuracy;
  j["direction_accuracy_ceiling"] = ceiling.direction_accuracy;
  j["num"] = scores.num;
  return j.dump();
}

std::vector<MotionPrompt> load_motion_prompts(const std::string& data_dir) {
  const auto path = std::filesystem::path(data_dir) / "eval_prompts.jsonl";
  std::ifstream f(path);
  if (!f)
    throw data::DataError(fmt::format("{}: cannot open (make the set with `flowtrain data make-moving-fashion`)",
                                      path.string()));
  const auto& classes = data::composition_class_names();
  const auto& colors = data::composition_color_names();
  std::vector<MotionPrompt> prompts;
  int64_t line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", path.string(), line_no);
    MotionPrompt p;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      p.caption = j.at("caption").get<std::string>();
      p.class_id = j.at("class_id").get<int64_t>();
      const std::string color = j.at("color").get<std::string>(), direction = j.at("direction").get<std::string>();
      p.color = static_cast<int64_t>(std::find(colors.begin(), colors.end(), color) - colors.begin());
      p.direction = parse_motion_direction(direction);
      if (p.class_id < 0 || p.class_id >= static_cast<int64_t>(classes.size()))
        throw data::DataError(fmt::format("{}: class_id {} is not a Fashion-MNIST class", where, p.class_id));
      if (p.color >= static_cast<int64_t>(colors.size()))
        throw data::DataError(fmt::format("{}: unknown colour '{}'", where, color));
      if (p.direction < 0) throw data::DataError(fmt::format("{}: unknown direction '{}'", where, direction));
    } catch (const nlohmann::json::exception& e) {
      throw data::DataError(fmt::format("{}: {}", where, e.what()));
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

namespace {

// The judge and the real side, loaded once per (data set, classifier cache, device).
struct MotionEvalContext {
  TrainedClassifier classifier;
  std::vector<MotionPrompt> prompts;
  at::Tensor real;  // uint8 [M, T, 3, H, W], the real clips of the prompts
  std::map<int64_t, MotionScores> ceilings;
};

JudgeCache<MotionEvalContext> g_judges;

// The caller holds g_judges.lock().
MotionEvalContext& motion_context_for(const std::string& data_dir, const std::string& classifier_dir,
                                      const c10::Device& device) {
  return g_judges.get(data_dir, classifier_dir, device, [&] {
    auto ctx = std::make_unique<MotionEvalContext>();
    // Trained on garments as this judge sees them (16-pixel drawings scaled back up): the
    // crisp-image classifier reads them much less reliably, which capped the ceiling.
    ClassifierTrainOptions options;
    options.view_side = kGarmentSide;
    ctx->classifier = load_or_train_classifier(classifier_dir, fashion_dir_of(data_dir), device, options);
    ctx->prompts = load_motion_prompts(data_dir);
    const std::string clips_path = (std::filesystem::path(data_dir) / "eval_clips.safetensors").string();
    const data::SafetensorsReader reader(clips_path);
    if (!reader.contains("clips")) throw data::DataError(fmt::format("{}: no tensor 'clips'", clips_path));
    ctx->real = reader.get("clips");
    if (ctx->real.dim() != 5 || ctx->real.size(0) != static_cast<int64_t>(ctx->prompts.size()))
      throw data::DataError(fmt::format("{}: 'clips' must be uint8 [{}, T, 3, H, W] (one per evaluation prompt), got {}",
                                        clips_path, ctx->prompts.size(), fmt::join(ctx->real.sizes(), "×")));
    return ctx;
  });
}

CropClassifier classifier_of(TrainedClassifier& trained) {
  return [&trained](const at::Tensor& crops) {
    return models::classify_images(trained.model, crops).logits.argmax(1);
  };
}

}  // namespace

MotionFollowingReport score_motion_following(const at::Tensor& samples, const std::string& data_dir,
                                             const std::string& classifier_dir, const c10::Device& device) {
  const auto lock = g_judges.lock();
  MotionEvalContext& ctx = motion_context_for(data_dir, classifier_dir, device);
  TORCH_CHECK(samples.dim() == 5, "motion following: samples must be [N, C, T, H, W], got ", samples.sizes());
  const int64_t n = samples.size(0);
  if (n > static_cast<int64_t>(ctx.prompts.size()))
    throw data::DataError(fmt::format("{}: {} samples to score but the set has {} evaluation prompts (make it with a "
                                      "larger --num-eval)",
                                      data_dir, n, ctx.prompts.size()));
  const std::vector<MotionPrompt> prompts(ctx.prompts.begin(), ctx.prompts.begin() + n);
  const CropClassifier classify = classifier_of(ctx.classifier);
  MotionFollowingReport report;
  report.scores = score_clip_readings(read_clips(samples.permute({0, 2, 1, 3, 4}), classify), prompts);
  auto ceiling = ctx.ceilings.find(n);
  if (ceiling == ctx.ceilings.end())
    ceiling =
        ctx.ceilings.emplace(n, score_clip_readings(read_clips(ctx.real.narrow(0, 0, n), classify), prompts)).first;
  report.ceiling = ceiling->second;
  return report;
}

void check_motion_following_config(const Config& c, const models::DiffusionModel& model) {
  const std::string where = c.source_path.empty() ? std::string("config") : c.source_path;
  const std::vector<int64_t> shape = model.sample_shape();  // [C, T, H, W]
  if (shape.size() != 4 || shape[0] != 3 || shape[2] < 16 || shape[3] < 16)
    throw ConfigError(fmt::format("{}: motion following judges RGB clips of frames at least 16×16; the model makes {} "
                                  "('model.in_channels', 'model.frames', 'model.image_size')",
                                  where, fmt::join(shape, "×")));
  if (!reads_caption_tokens(c.model))
    throw ConfigError(fmt::format("{}: motion following generates the evaluation prompts, which needs a model that "
                                  "reads captions through its own text encoder ('model.text_encoder_layers' > 0)",
                                  where));
  const auto prompts = static_cast<int64_t>(load_motion_prompts(c.data.path).size());
  if (c.eval.num < 1 || c.eval.num > prompts)
    throw ConfigError(fmt::format("{}: 'eval.num' is {}; it must be in [1, {}] ({} has {} evaluation prompts)", where,
                                  c.eval.num, prompts, c.data.path, prompts));
}

MotionFollowingReport evaluate_motion_following_checkpoint(const Config& config, const std::string& checkpoint_dir,
                                                           int64_t num_override, bool raw) {
  const CheckpointEvalSamples e =
      generate_checkpoint_eval_samples(config, checkpoint_dir, num_override, raw, check_motion_following_config);
  MotionFollowingReport report =
      score_motion_following(e.samples, e.config.data.path, e.config.eval.classifier_dir, e.device);
  write_file_atomic(e.report_path, report.to_json() + "\n");
  return report;
}

namespace {

class MotionFollowingEvaluator : public Evaluator {
 public:
  std::string name() const override { return "motion following"; }
  void check(const Config& config, const models::DiffusionModel& model) const override {
    check_motion_following_config(config, model);
  }
  EvalScores score(const at::Tensor& samples, const models::DiffusionModel&, const Config& config,
                   const c10::Device& device) const override {
    const MotionFollowingReport m = score_motion_following(samples, config.data.path, config.eval.classifier_dir, device);
    EvalScores s;
    s.metrics = {{"eval_prompt_accuracy", m.scores.prompt_accuracy},
                 {"eval_class_accuracy", m.scores.class_accuracy},
                 {"eval_color_accuracy", m.scores.color_accuracy},
                 {"eval_direction_accuracy", m.scores.direction_accuracy},
                 {"eval_temporal_consistency", m.scores.temporal_consistency}};
    s.summary = fmt::format(
        "prompt accuracy {:.1f}% (judge's ceiling {:.1f}%) | class {:.1f}% | colour {:.1f}% | direction {:.1f}% | "
        "temporal consistency {:.1f}%",
        100 * m.scores.prompt_accuracy, 100 * m.ceiling.prompt_accuracy, 100 * m.scores.class_accuracy,
        100 * m.scores.color_accuracy, 100 * m.scores.direction_accuracy, 100 * m.scores.temporal_consistency);
    s.num = m.scores.num;
    s.unit = "prompts";
    return s;
  }
  std::string evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override,
                                  bool raw) const override {
    return evaluate_motion_following_checkpoint(config, checkpoint_dir, num_override, raw).to_json();
  }
};

}  // namespace

std::unique_ptr<Evaluator> make_motion_following_evaluator() { return std::make_unique<MotionFollowingEvaluator>(); }

}  // namespace flowtrain::trainer
