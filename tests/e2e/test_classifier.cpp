// The quality-metric classifier on the real Fashion-MNIST data: it trains to >= 90 % test
// accuracy, is cached and reloaded, a damaged or mismatched cache is retrained, and its feature
// space separates real images from noise. Then the whole evaluation on a (trivially bad) DiT.
#include "data/fashion_mnist.h"
#include "data/safetensors.h"
#include "models/classifier.h"
#include "test_util.h"
#include "trainer/run_conditioning.h"
#include "trainer/builders.h"
#include "trainer/family.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/config/config.h"
#include "trainer/eval/evaluate.h"
#include "trainer/eval/quality.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain;
using namespace flowtrain::test;

namespace {


const c10::Device kCpu(c10::kCPU);

// A cache directory shared by the tests below that need a fully trained classifier but do not
// test training itself. The first test fills it with the classifier it trains (so a serial
// ctest run trains once); a test run alone trains into it.
std::string shared_cache_dir() { return (fs::path(FLOWTRAIN_TEST_TMP) / "classifier-cache").string(); }

void share_cache_file(const std::string& path) {
  fs::create_directories(shared_cache_dir());
  const fs::path target = fs::path(shared_cache_dir()) / fs::path(path).filename();
  if (fs::exists(target)) return;
  fs::copy_file(path, target.string() + ".tmp", fs::copy_options::overwrite_existing);
  fs::rename(target.string() + ".tmp", target);
}

// A recipe that trains in seconds, for the tests about the cache protocol (accuracy irrelevant).
trainer::ClassifierTrainOptions fast_recipe() {
  trainer::ClassifierTrainOptions o;
  o.epochs = 1;
  o.max_train_images = 1024;
  return o;
}

at::Tensor subset(const at::Tensor& images, int64_t n, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return images.index_select(0, at::randperm(images.size(0), gen, at::TensorOptions().dtype(at::kLong)).slice(0, 0, n));
}

}  // namespace

TEST(Classifier, TrainsToNinetyPercentOnFirstUseThenLoadsFromTheCache) {
  REQUIRE_DATA();
  const std::string dir = scratch_dir("cache");
  trainer::TrainedClassifier first = trainer::load_or_train_classifier(dir, fashion_mnist_dir(), kCpu);
  EXPECT_TRUE(first.trained_now);
  EXPECT_GE(first.test_accuracy, 0.90);
  ASSERT_TRUE(fs::exists(first.path));
  EXPECT_EQ(fs::path(first.path).parent_path(), fs::path(dir));
  std::printf("[classifier] test accuracy %.4f, cache %s\n", first.test_accuracy, first.path.c_str());

  trainer::TrainedClassifier second = trainer::load_or_train_classifier(dir, fashion_mnist_dir(), kCpu);
  EXPECT_FALSE(second.trained_now);
  EXPECT_EQ(second.path, first.path);
  EXPECT_EQ(second.weights_hash, first.weights_hash);
  EXPECT_EQ(second.test_accuracy, first.test_accuracy);
  // The loaded network is the trained one: same outputs, and the recorded accuracy is reproduced.
  const data::ImageDataset test = data::load_fashion_mnist(fashion_mnist_dir(), "test");
  models::ClassifierOutputs a = models::classify_images(first.model, test.images);
  models::ClassifierOutputs b = models::classify_images(second.model, test.images);
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  EXPECT_TRUE(at::equal(a.features, b.features));
  EXPECT_EQ(trainer::class_accuracy(b.logits, test.labels), first.test_accuracy);
  share_cache_file(first.path);
}

TEST(Classifier, CorruptTruncatedOrMismatchedCacheIsRetrained) {
  REQUIRE_DATA();
  const std::string dir = scratch_dir("cache");
  const data::ImageDataset train = data::load_fashion_mnist(fashion_mnist_dir(), "train");
  const data::ImageDataset test = data::load_fashion_mnist(fashion_mnist_dir(), "test");
  auto load = [&](const trainer::ClassifierTrainOptions& o) {
    return trainer::load_or_train_classifier(dir, train, test, kCpu, o);
  };
  trainer::TrainedClassifier trained = load(fast_recipe());
  ASSERT_TRUE(trained.trained_now);
  ASSERT_FALSE(load(fast_recipe()).trained_now);
  const std::string good = read_file(trained.path);

  // One flipped byte in the middle of the file: inside fc1.weight, the bulk of the data buffer.
  // The file still parses; only the weights hash can tell.
  std::string corrupt = good;
  corrupt[corrupt.size() / 2] ^= 0x5a;
  write_file(trained.path, corrupt);
  EXPECT_NO_THROW(data::SafetensorsReader{trained.path});
  trainer::TrainedClassifier retrained = load(fast_recipe());
  EXPECT_TRUE(retrained.trained_now);
  // Training is a pure function of the recipe and the data on the CPU (fixed thread count):
  // the same weights again.
  EXPECT_EQ(retrained.weights_hash, trained.weights_hash);
  EXPECT_FALSE(load(fast_recipe()).trained_now);

  // Truncated (a crash of a non-atomic writer, a full disk): the reader refuses it.
  write_file(trained.path, good.substr(0, good.size() - 1000));
  EXPECT_TRUE(load(fast_recipe()).trained_now);

  // A different recipe is not served the old network.
  trainer::ClassifierTrainOptions other = fast_recipe();
  other.seed = 1;
  trainer::TrainedClassifier reseeded = load(other);
  EXPECT_TRUE(reseeded.trained_now);
  EXPECT_NE(reseeded.weights_hash, trained.weights_hash);
  EXPECT_FALSE(load(other).trained_now);
}

TEST(Classifier, FeatureDistanceSeparatesRealImagesFromNoise) {
  REQUIRE_DATA();
  trainer::TrainedClassifier clf = trainer::load_or_train_classifier(shared_cache_dir(), fashion_mnist_dir(), kCpu);
  const data::ImageDataset train = data::load_fashion_mnist(fashion_mnist_dir(), "train");
  const data::ImageDataset test = data::load_fashion_mnist(fashion_mnist_dir(), "test");
  const int64_t n = 1000;
  at::Tensor train_feats = models::classify_images(clf.model, subset(train.images, n, 1)).features;
  at::Tensor test_feats = models::classify_images(clf.model, subset(test.images, n, 2)).features;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor noise = at::rand({n, 1, 28, 28}, gen) * 2 - 1;  // uniform in the data's [−1, 1]
  models::ClassifierOutputs noise_out = models::classify_images(clf.model, noise);

  const double floor = trainer::frechet_distance(test_feats, train_feats);
  const double to_noise = trainer::frechet_distance(noise_out.features, train_feats);
  std::printf("[classifier] FD test-vs-train %.4f, noise-vs-train %.4f (N = %ld)\n", floor, to_noise, long(n));
  EXPECT_GT(floor, 0.0);                // finite-N estimates of different sets never coincide
  EXPECT_GT(to_noise, 20.0 * floor);    // orders of magnitude apart in practice
  // A 32×32 input padded like the loader does is cropped back: same features.
  at::Tensor small = subset(test.images, 8, 2);
  at::Tensor padded = at::constant_pad_nd(models::classifier_input_from_uint8(small), {2, 2, 2, 2}, -1.0);
  EXPECT_TRUE(at::allclose(models::classify_images(clf.model, padded).features,
                           models::classify_images(clf.model, small).features));
}

TEST(ClassifierEval, UntrainedDiTScoresFarAboveTheFloorAndWritesEvalJson) {
  REQUIRE_DATA();
  trainer::Config c = trainer::load_config(source_path("tests/configs/tiny_fashion.yaml"),
                                           {"data.path=" + fashion_mnist_dir(), "eval.num=200", "eval.steps=2",
                                            "eval.sampler=euler", "eval.classifier_dir=" + shared_cache_dir()});
  // A fresh DiT: adaLN-Zero makes its velocity 0, so its "samples" are the initial noise.
  const auto model = trainer::build_model(c.model);
  const std::string run = scratch_dir("run");
  trainer::CheckpointContents contents;
  contents.model = trainer::state_dict(*model);
  contents.config_yaml = trainer::to_yaml(c);
  const std::string ckpt = trainer::save_checkpoint(run + "/checkpoints", contents);

  trainer::QualityReport r = trainer::evaluate_checkpoint(c, ckpt, /*num_override=*/100);
  EXPECT_EQ(r.num, 100);
  EXPECT_GE(r.classifier_test_accuracy, 0.90);
  EXPECT_GT(r.fd_floor, 0.0);
  EXPECT_GT(r.fd, 10.0 * r.fd_floor);
  EXPECT_LT(r.class_accuracy, 0.5);  // noise is not class-conditional (chance is 0.1)
  EXPECT_GE(r.inception_score, 1.0);
  EXPECT_LE(r.inception_score, 10.0 + 1e-9);

  nlohmann::json j = nlohmann::json::parse(read_file(ckpt + "/eval.json"));
  for (const char* key : {"fd", "fd_floor", "class_accuracy", "inception_score", "classifier_test_accuracy", "num"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["num"].get<int64_t>(), 100);
  EXPECT_DOUBLE_EQ(j["fd"].get<double>(), r.fd);

  // Same process, same N: the real reference and classifier are reused; the samples too
  // (same seed), so the report is identical.
  const auto reloaded = trainer::build_model(c.model);
  trainer::load_state_dict(*reloaded, contents.model, "test");
  trainer::Config c100 = c;
  c100.eval.num = 100;
  trainer::QualityReport again =
      trainer::evaluate_model(*reloaded, trainer::run_conditioning(c, nullptr).of_eval_rows, c100, kCpu);
  EXPECT_EQ(again.to_json(), r.to_json());
}
