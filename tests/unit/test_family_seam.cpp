// The seam between the trainer and a model family (trainer/family.h): a family the trainer has
// never heard of — a per-token MLP "toy" defined in this file and registered at run time —
// trains, checkpoints and resumes through the unchanged Trainer. That is the promise "a new
// family is a folder plus one registration line".
#include "models/layers.h"
#include "test_util.h"
#include "trainer/families/common.h"
#include "trainer/family.h"
#include "trainer/trainer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <filesystem>
#include <fstream>

namespace flowtrain {
namespace {

namespace fs = std::filesystem;
using models::Conditioning;
using models::Tensors;

// x [B, C, H, W] → p×p patches → tokens [B, T, C·p²] → embed → depth residual MLP blocks, each
// shifted by the time + label embedding → out → [B, C, H, W]. No attention, so set_attention has
// nothing to replace (context parallelism would need one; this test runs on one process).
struct ToyBlockImpl : torch::nn::Module {
  explicit ToyBlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 2 * width))),
        fc2(register_module("fc2", torch::nn::Linear(2 * width, width))) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c) {
    return x + fc2->forward(at::gelu(fc1->forward(norm->forward(x) + c.unsqueeze(1))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(ToyBlock);

struct ToyOptions {
  int64_t channels = 1, side = 28, patch = 4, width = 32, depth = 2, classes = 10;
  int64_t tokens() const { return (side / patch) * (side / patch); }
  int64_t token_dim() const { return channels * patch * patch; }
};

class ToyModel : public models::DiffusionModel {
 public:
  explicit ToyModel(ToyOptions o) : o_(o) {
    embed = register_module("embed", torch::nn::Linear(o.token_dim(), o.width));
    t_embed = register_module("t_embed", torch::nn::Linear(1, o.width));
    y_embed = register_module("y_embed", torch::nn::Embedding(o.classes + 1, o.width));  // + the null class
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.depth; ++i) blocks->push_back(ToyBlock(o.width));
    out = register_module("out", torch::nn::Linear(o.width, o.token_dim()));
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) override {
    const int64_t B = x.size(0), g = o_.side / o_.patch;
    // [B, C, g, p, g, p] → [B, g, g, C, p, p] → [B, T, C·p²]
    at::Tensor tokens = x.reshape({B, o_.channels, g, o_.patch, g, o_.patch}).permute({0, 2, 4, 1, 3, 5});
    tokens = embed->forward(tokens.reshape({B, o_.tokens(), o_.token_dim()}));
    const at::Tensor c = t_embed->forward(t.to(x.dtype()).unsqueeze(1)) + y_embed->forward(cond.at("labels"));
    for (int64_t i = 0; i < o_.depth; ++i) {
      auto block = blocks[i]->as<ToyBlockImpl>();
      const models::UnitCall call = [block](const Tensors& in) { return Tensors{block->forward(in[0], in[1])}; };
      tokens = unit_runner ? unit_runner(i, call, {tokens, c})[0] : call({tokens, c})[0];
    }
    at::Tensor y = out->forward(tokens).reshape({B, g, g, o_.channels, o_.patch, o_.patch});
    return y.permute({0, 3, 1, 4, 2, 5}).reshape(x.sizes());
  }

  std::vector<int64_t> sample_shape() const override { return {o_.channels, o_.side, o_.side}; }
  int64_t tokens_per_sample() const override { return o_.tokens(); }
  std::string token_layout() const override { return fmt::format("({} / {})²", o_.side, o_.patch); }
  int64_t attention_heads() const override { return 1; }
  double train_flops_per_sample() const override {
    const double per_token = 2.0 * (o_.token_dim() * o_.width * 2 + o_.depth * 4 * o_.width * o_.width);
    return 3.0 * per_token * o_.tokens();
  }
  std::string describe() const override { return fmt::format("toy MLP depth {} width {}", o_.depth, o_.width); }

  models::ConditioningDropout conditioning_dropout() const override {
    models::ConditioningDropout d;
    d.probabilities = {0.1};
    d.apply = [null_class = o_.classes](const Conditioning& cond, const std::vector<at::Tensor>& dropped) {
      Conditioning out = cond;
      const at::Tensor& labels = cond.at("labels");
      out.set("labels", at::where(dropped[0].to(labels.device()), at::full_like(labels, null_class), labels));
      return out;
    };
    return d;
  }
  Conditioning null_conditioning(const Conditioning& cond) const override {
    return {{"labels", at::full_like(cond.at("labels"), o_.classes)}};
  }
  models::UnitPlan units() const override {
    models::UnitPlan plan;
    plan.stem = {"embed", "t_embed", "y_embed"};
    for (int64_t i = 0; i < o_.depth; ++i) plan.blocks.push_back(fmt::format("blocks.{}", i));
    plan.head = {"out"};
    return plan;
  }
  void set_attention(const models::AttentionFn&) override {}

  torch::nn::Linear embed{nullptr}, t_embed{nullptr}, out{nullptr};
  torch::nn::Embedding y_embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};

 private:
  ToyOptions o_;
};

// The toy's own key of the model section: model.classes.
struct ToyConfig {
  int64_t classes = 4;
};

ToyOptions toy_options(const trainer::ModelConfig& m) {
  ToyOptions o;
  o.channels = m.in_channels;
  o.side = m.image_size;
  o.patch = m.patch;
  o.width = m.resolved_hidden();
  o.depth = m.resolved_depth();
  o.classes = m.family<ToyConfig>().classes;
  return o;
}

// The whole family: its folder would hold this function, and the registry one line naming it.
trainer::FamilySpec toy_family() {
  trainer::FamilySpec spec;
  spec.arch = "toy";
  spec.sizes = {"toy-small"};
  spec.preset = [](const std::string& size) {
    return trainer::families::preset_from(
        size, "toy", [](const std::string&) { return trainer::ModelPreset{32, 2, 1}; }, {"toy-small"});
  };
  spec.keys = trainer::family_keys<ToyConfig>()
                  .add("classes", &ToyConfig::classes, trainer::at_least(1), "class labels of the toy")
                  .keys;
  spec.validate = [](const trainer::ModelConfig& m) { trainer::families::check_patch_transformer(m); };
  spec.build = [](const trainer::ModelConfig& m) { return std::make_shared<ToyModel>(toy_options(m)); };
  spec.cost = [](const trainer::ModelConfig& m) {
    const ToyModel model(toy_options(m));
    return trainer::ModelCost{models::count_parameters(model), 0, model.train_flops_per_sample(),
                              model.tokens_per_sample()};
  };
  spec.image_tokens = [](const trainer::ModelConfig& m) { return ToyModel(toy_options(m)).tokens_per_sample(); };
  spec.class_conditioning = [](const at::Tensor& labels) { return Conditioning{{"labels", labels}}; };
  spec.classes = [](const trainer::ModelConfig& m) { return m.family<ToyConfig>().classes; };
  spec.parallelize = trainer::parallelize_transformer;
  return spec;
}

// The toy is known for the life of one test only: other tests (the config's list of archs) see
// the built-in families whatever order they run in.
struct ToyRegistered {
  ToyRegistered() { trainer::register_family(toy_family()); }
  ~ToyRegistered() { trainer::unregister_family("toy"); }
};

trainer::Config toy_config(const std::string& out_dir, int64_t steps) {
  return trainer::parse_config("", "toy.yaml",
                               {"model.arch=toy", "model.size=toy-small", "model.patch=4", "model.image_size=28",
                                "model.in_channels=1", "model.classes=10", "data.source=synthetic",
                                "data.batch_size=8", "data.workers=0", "train.steps=" + std::to_string(steps),
                                "train.log_every=1", "train.threads=1", "train.tensorboard=false", "optim.lr=1e-3",
                                "sample.every=0", "checkpoint.every=2", "checkpoint.async=false", "run.device=cpu",
                                "run.out_dir=" + out_dir});
}

std::vector<double> losses(const std::string& metrics_path) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"loss\":");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 7)));
  }
  return out;
}

TEST(FamilySeam, ARegisteredFamilyIsKnownToTheConfigAndRefusedTwice) {
  const ToyRegistered toy;
  const auto names = trainer::model_arch_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "toy"), names.end());
  // Its size is a valid model.size only through the registry (the schema asks it when checking),
  // and its own key is a model key of toy configs, written by to_yaml and of no other family.
  const trainer::Config c = toy_config(test::scratch_dir("toy_cfg"), 1);
  EXPECT_EQ(c.model.resolved_hidden(), 32);
  EXPECT_EQ(c.model.family<ToyConfig>().classes, 10);
  EXPECT_NE(trainer::to_yaml(c).find("  classes: 10  # class labels of the toy\n"), std::string::npos);
  EXPECT_THROW(trainer::parse_config("", "dit.yaml", {"model.classes=10"}), trainer::ConfigError);
  EXPECT_THROW(trainer::register_family(toy_family()), std::invalid_argument);
  trainer::FamilySpec half = toy_family();
  half.arch = "toy-without-conditioning";
  half.class_conditioning = nullptr;
  EXPECT_THROW(trainer::register_family(half), std::invalid_argument);
  EXPECT_THROW(trainer::unregister_family("dit"), std::invalid_argument);  // built-ins stay
}

TEST(FamilySeam, AnUnregisteredFamilyIsAConfigErrorAgain) {
  { const ToyRegistered toy; }
  try {
    toy_config(test::scratch_dir("toy_gone"), 1);
    FAIL() << "model.arch toy was accepted after the toy was unregistered";
  } catch (const trainer::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.arch' must be one of dit|flux|vae, got 'toy'"), std::string::npos)
        << e.what();
  }
}

TEST(FamilySeam, AToyFamilyTrainsCheckpointsAndResumesThroughTheUnchangedTrainer) {
  const ToyRegistered toy;
  const std::string dir = test::scratch_dir("toy_family_run");
  {
    trainer::Trainer t(toy_config(dir, 4));
    EXPECT_EQ(t.run(), 4);
  }
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "step-0000004"));
  {
    // Resumed: picks up at step 4 of the same directory and runs to 6.
    trainer::Trainer t(toy_config(dir, 6));
    EXPECT_EQ(t.run(), 6);
  }
  const std::vector<double> loss = losses(dir + "/metrics.jsonl");
  ASSERT_EQ(loss.size(), 6u);  // one line a step (train.log_every 1), the resumed run appending
  for (double l : loss) EXPECT_TRUE(std::isfinite(l) && l > 0) << l;
}

}  // namespace
}  // namespace flowtrain
