#include "trainer/eval/evaluate.h"
#include "trainer/frozen/frozen_sampling.h"

#include "trainer/eval/evaluator.h"
#include "trainer/eval/judge_cache.h"

#include "data/fashion_mnist.h"
#include "models/autocast_region.h"
#include "models/classifier.h"
#include "models/flow_matching.h"
#include "trainer/builders.h"
#include "trainer/family.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/eval/quality.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/eval/validation_loss.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace flowtrain::trainer {

namespace {

constexpr int64_t kClasses = models::FashionClassifierImpl::kNumClasses;
constexpr int64_t kMaxBatch = 250;  // samples integrated at once: bounds memory on small GPUs / CPU
// Fixed shuffles for the real subsets, independent of eval.seed so every evaluation of every run
// compares against the same real images.
constexpr uint64_t kTrainSubsetSeed = 1000, kTestSubsetSeed = 1001;

// The real side of the metrics at one N: computed once per process.
struct RealReference {
  FeatureStats train;  // statistics of N class-matched training images
  double fd_floor = 0.0;
};

// What every evaluation in a process shares: the data, the classifier, the real references.
struct EvalContext {
  data::ImageDataset train, test;
  TrainedClassifier classifier;
  std::map<int64_t, RealReference> references;  // by N
};

// Indices of n images whose labels follow i % kClasses: the k-th of class c is the k-th image of
// class c in a shuffle seeded by `seed`.
at::Tensor class_matched_subset(const data::ImageDataset& dataset, int64_t n, uint64_t seed, const std::string& split) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor order = at::randperm(dataset.size(), gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor labels = dataset.labels.to(at::kLong).index_select(0, order).contiguous();
  std::vector<std::vector<int64_t>> by_class(kClasses);
  const int64_t* o = order.data_ptr<int64_t>();
  const int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < dataset.size(); ++i)
    if (l[i] >= 0 && l[i] < kClasses) by_class[l[i]].push_back(o[i]);
  std::vector<int64_t> chosen(n);
  std::vector<size_t> used(kClasses, 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto& pool = by_class[i % kClasses];
    if (used[i % kClasses] >= pool.size())
      throw ConfigError(fmt::format("'eval.num' is {} but the Fashion-MNIST {} split has only {} images of class {}",
                                    n, split, pool.size(), i % kClasses));
    chosen[i] = pool[used[i % kClasses]++];
  }
  return at::tensor(chosen, at::TensorOptions().dtype(at::kLong));
}

}  // namespace

void check_eval_config(const Config& c, const models::DiffusionModel& model) {
  const std::string where = c.source_path.empty() ? std::string("config") : c.source_path;
  auto fail = [&](const std::string& what) { throw ConfigError(where + ": " + what); };
  if (c.data.source != DataSource::fashion_mnist)
    fail(fmt::format("'data.source' is '{}'; the quality metrics need fashion_mnist (their classifier's data set)",
                     name_of(c.data.source)));
  const std::vector<int64_t> shape = model.sample_shape();  // [C, H, W]
  if (shape[0] != 1) fail(fmt::format("'model.in_channels' is {}; the quality metrics score 1-channel images", shape[0]));
  if (shape[1] < models::FashionClassifierImpl::kImageSide)
    fail(fmt::format("'model.image_size' is {}; the quality metrics need >= 28", shape[1]));
  if (class_count(c.model) < kClasses)
    fail(fmt::format("'model.num_classes' is {}; the quality metrics sample all {} Fashion-MNIST classes",
                     class_count(c.model), kClasses));
  if (c.eval.num < 2) fail(fmt::format("'eval.num' must be >= 2, got {}", c.eval.num));
}

namespace {

// The process-wide context for (classifier cache, data directory, device), created on first use.
// Evaluations are serialised by the mutex (they share the classifier module).
JudgeCache<EvalContext> g_judges;

// The caller holds g_judges.lock().
EvalContext& eval_context(const Config& c, const c10::Device& device) {
  return g_judges.get(c.data.path, c.eval.classifier_dir, device, [&] {
    auto context = std::make_unique<EvalContext>();
    context->train = data::load_fashion_mnist(c.data.path, "train");
    context->test = data::load_fashion_mnist(c.data.path, "test");
    context->classifier = load_or_train_classifier(c.eval.classifier_dir, context->train, context->test, device);
    return context;
  });
}

const RealReference& real_reference(EvalContext& context, int64_t n) {
  auto it = context.references.find(n);
  if (it != context.references.end()) return it->second;
  const auto start = std::chrono::steady_clock::now();
  at::Tensor train_index = class_matched_subset(context.train, n, kTrainSubsetSeed, "train");
  at::Tensor test_index = class_matched_subset(context.test, n, kTestSubsetSeed, "test");
  auto& model = context.classifier.model;
  RealReference ref;
  ref.train = feature_stats(models::classify_images(model, context.train.images.index_select(0, train_index)).features);
  const FeatureStats test = feature_stats(models::classify_images(model, context.test.images.index_select(0, test_index)).features);
  ref.fd_floor = frechet_distance(test, ref.train);
  spdlog::info("eval: real reference at N = {}: FD floor (test vs train) {:.4f} ({:.1f} s)", n, ref.fd_floor,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return context.references.emplace(n, std::move(ref)).first->second;
}

// The held-out loss of `model` on the whole test split (10,000 images, 1,000 per class), ordered
// so that image i is of class i % 10 — the rows of `conditioning`. One forward per image: seconds
// on a CPU, and every run of a config is measured on the same images, times and noise.
double held_out_loss(models::DiffusionModel& model, const RowConditioning& conditioning, const Config& c,
                     const c10::Device& device) {
  auto lock = g_judges.lock();
  EvalContext& context = eval_context(c, device);
  const int64_t n = context.test.size() / kClasses * kClasses;
  const at::Tensor images =
      context.test.images.index_select(0, class_matched_subset(context.test, n, kTestSubsetSeed, "test"));
  lock.unlock();
  return validation_loss(model, images, conditioning(at::arange(n, at::kLong)), c, device,
                         static_cast<uint64_t>(c.eval.seed), "test images");
}

}  // namespace

std::string QualityReport::to_json() const {
  nlohmann::ordered_json j;
  j["fd"] = fd;
  j["fd_floor"] = fd_floor;
  j["class_accuracy"] = class_accuracy;
  j["inception_score"] = inception_score;
  j["classifier_test_accuracy"] = classifier_test_accuracy;
  j["num"] = num;
  if (std::isfinite(val_loss)) j["val_loss"] = val_loss;
  return j.dump();
}

at::Tensor generate_eval_samples(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                                 const RowConditioning& conditioning, const Config& c, const c10::Device& device,
                                 int64_t first, int64_t count) {
  if (count < 0) {
    first = 0;
    count = c.eval.num;
  }
  const models::SamplerOptions so = sampler_options(c.eval.sampler, c.eval.steps, c.eval.cfg_scale, time_shift(c));
  std::vector<at::Tensor> out;
  for (int64_t begin = 0; begin < count; begin += kMaxBatch) {
    const int64_t rows = std::min(kMaxBatch, count - begin);
    at::Tensor x = samples_to_pixels(
        c, sample_rows(velocity, model, conditioning, c.eval.num, c.eval.seed, so, device, first + begin, rows));
    // [−1, 1] -> 0…255, rounded as an 8-bit image file would be
    out.push_back(x.clamp(-1.0, 1.0).add(1.0).mul(127.5).round().to(at::kByte));
    if (begin + rows < count) spdlog::info("eval: {}/{} samples", begin + rows, count);  // minutes on a CPU
  }
  return at::cat(out);
}

at::Tensor generate_eval_samples(models::DiffusionModel& model, const RowConditioning& conditioning, const Config& config,
                                 const c10::Device& device) {
  const bool was_training = model.is_training();
  model.eval();
  at::Tensor samples;
  {
    at::NoGradGuard no_grad;
    // In the training precision, as during training (TrainState::with_sampling_model).
    models::AutocastRegion autocast(config.train.bf16_autocast(), device.type());
    models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& c) {
      return model.forward(x, t, c);
    };
    spdlog::info("eval: generating {} samples ({} {} steps, cfg {}, seed {})", config.eval.num, name_of(config.eval.sampler),
                 config.eval.steps, config.eval.cfg_scale, config.eval.seed);
    samples = generate_eval_samples(velocity, model, conditioning, config, device);
  }
  model.train(was_training);
  return samples;
}

QualityReport evaluate_model(models::DiffusionModel& model, const RowConditioning& conditioning, const Config& config,
                             const c10::Device& device) {
  check_eval_config(config, model);
  QualityReport report =
      score_eval_samples(generate_eval_samples(model, conditioning, config, device), model, config, device);
  report.val_loss = held_out_loss(model, conditioning, config, device);
  return report;
}

QualityReport score_eval_samples(const at::Tensor& samples, const models::DiffusionModel& model, const Config& config,
                                 const c10::Device& device) {
  check_eval_config(config, model);
  const auto lock = g_judges.lock();
  EvalContext& context = eval_context(config, device);
  const int64_t n = config.eval.num;
  TORCH_CHECK(samples.size(0) == n, "score_eval_samples: ", samples.size(0), " samples for eval.num ", n);
  const RealReference& reference = real_reference(context, n);

  const auto start = std::chrono::steady_clock::now();
  at::Tensor labels = at::arange(n, at::TensorOptions().dtype(at::kLong)) % kClasses;
  models::ClassifierOutputs scored = models::classify_images(context.classifier.model, samples);

  QualityReport report;
  report.fd = frechet_distance(feature_stats(scored.features), reference.train);
  report.fd_floor = reference.fd_floor;
  report.class_accuracy = class_accuracy(scored.logits, labels);
  report.inception_score = inception_score(at::softmax(scored.logits.to(at::kDouble), 1));
  report.classifier_test_accuracy = context.classifier.test_accuracy;
  report.num = n;
  spdlog::info("eval: fd {:.4f} (floor {:.4f}), class accuracy {:.4f}, inception score {:.3f} ({:.0f} s)", report.fd,
               report.fd_floor, report.class_accuracy, report.inception_score,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return report;
}

CheckpointEvalSamples generate_checkpoint_eval_samples(const Config& config, const std::string& checkpoint_dir,
                                                       int64_t num_override, bool raw, const EvalConfigCheck& check) {
  CheckpointEvalSamples out;
  out.config = config;
  Config& c = out.config;
  if (num_override > 0) c.eval.num = num_override;
  out.device = select_device(c.run);
  const CheckpointModel loaded = load_checkpoint_model(c, checkpoint_dir, raw, out.device);
  check(c, *loaded.model);
  spdlog::info("eval: {} weights of {} (step {}), {} samples ({} {} steps, cfg {}, seed {})",
               loaded.ema ? "EMA" : "raw", checkpoint_dir, loaded.step, c.eval.num, name_of(c.eval.sampler), c.eval.steps,
               c.eval.cfg_scale, c.eval.seed);
  out.samples = generate_eval_samples(*loaded.model, loaded.conditioning.of_eval_rows, c, out.device);
  out.eval_rows = loaded.conditioning.of_eval_rows;
  out.report_path = loaded.report_path;
  out.model = loaded.model;
  return out;
}

QualityReport evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override,
                                  bool raw) {
  const CheckpointEvalSamples e = generate_checkpoint_eval_samples(config, checkpoint_dir, num_override, raw, check_eval_config);
  QualityReport report = score_eval_samples(e.samples, *e.model, e.config, e.device);
  report.val_loss = held_out_loss(*e.model, e.eval_rows, e.config, e.device);
  write_file_atomic(e.report_path, report.to_json() + "\n");
  return report;
}

namespace {

class ClassConditionalEvaluator : public Evaluator {
 public:
  std::string name() const override { return "class-conditional quality"; }
  void check(const Config& config, const models::DiffusionModel& model) const override {
    check_eval_config(config, model);
  }
  EvalScores score(const at::Tensor& samples, const models::DiffusionModel& model, const Config& config,
                   const c10::Device& device) const override {
    const QualityReport q = score_eval_samples(samples, model, config, device);
    EvalScores s;
    s.metrics = {{"eval_fd", q.fd},
                 {"eval_fd_floor", q.fd_floor},
                 {"eval_class_accuracy", q.class_accuracy},
                 {"eval_inception_score", q.inception_score}};
    s.summary = fmt::format("FD {:.3f} (real-vs-real floor {:.3f}) | class accuracy {:.1f}% | IS {:.2f}", q.fd,
                            q.fd_floor, 100 * q.class_accuracy, q.inception_score);
    s.num = q.num;
    s.unit = "samples";
    return s;
  }
  std::string evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override,
                                  bool raw) const override {
    return trainer::evaluate_checkpoint(config, checkpoint_dir, num_override, raw).to_json();
  }
};

}  // namespace

std::unique_ptr<Evaluator> make_class_conditional_evaluator() { return std::make_unique<ClassConditionalEvaluator>(); }

}  // namespace flowtrain::trainer
