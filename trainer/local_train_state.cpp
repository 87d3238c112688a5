// TrainState for one process: the model's own parameters are the fp32 master weights.
#include "models/autocast_region.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"
#include "trainer/builders.h"
#include "trainer/train_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>

namespace flowtrain::trainer {

namespace {

int64_t tensor_bytes(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

class LocalTrainState : public TrainState {
 public:
  LocalTrainState(models::DiT model, const Config& config) : model_(std::move(model)), config_(config) {
    AdamWOptions adam{config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay};
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    optimizer_ = std::make_unique<AdamW>(named, adam);
    if (config.train.ema_decay > 0) ema_ = std::make_unique<Ema>(model_);
    if (config.train.activation_checkpointing != "none")
      model_->block_runner = [train = config.train](int64_t index, const models::BlockCall& call, const at::Tensor& x,
                                                    const at::Tensor& c) { return run_block(train, index, call, x, c); };
  }

  models::DiT& model() override { return model_; }

  StepReduction reduce_and_clip(const at::Tensor& local_loss, double max_norm, bool stop_requested) override {
    at::Tensor norm = clip_grad_norm(model_->parameters(), max_norm);
    return {norm, local_loss, at::full({}, stop_requested ? 1.0 : 0.0)};
  }
  void optimizer_step(double lr) override {
    optimizer_->step(lr);
    optimizer_->zero_grad();
  }
  void ema_update(double decay) override {
    if (ema_) ema_->update(model_, decay);
  }
  bool has_ema() const override { return ema_ != nullptr; }
  int64_t optimizer_step_count() const override { return optimizer_->step_count(); }
  void with_sampling_model(const std::function<void(const models::VelocityFn&)>& fn) override {
    models::DiT& model = ema_ ? ema_->model() : model_;
    const bool was_training = model->is_training();
    model->eval();
    at::NoGradGuard no_grad;
    models::AutocastRegion autocast(config_.train.precision == "bf16", model->pos_embed.device().type());
    fn([&model](const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) { return model->forward(x, t, y); });
    model->train(was_training);
  }

  void fill_checkpoint(CheckpointContents& c) override {
    c.model = state_dict(*model_);
    if (ema_) c.ema = state_dict(*ema_->model());
    for (const auto& slot : optimizer_->slots()) {
      c.optimizer.emplace_back("exp_avg." + slot.name, slot.exp_avg);
      c.optimizer.emplace_back("exp_avg_sq." + slot.name, slot.exp_avg_sq);
    }
    c.optimizer_step_count = optimizer_->step_count();
  }

  CheckpointContents restore(const std::string& dir) override {
    CheckpointContents c = load_checkpoint(dir);  // a sharded checkpoint arrives consolidated
    load_state_dict(*model_, c.model, dir + "/model weights");
    if (ema_) {
      if (c.ema.empty()) spdlog::warn("{} has no EMA weights; EMA restarts from the current weights", dir);
      load_state_dict(*ema_->model(), c.ema.empty() ? c.model : c.ema, dir + "/EMA weights");
    }
    std::map<std::string, at::Tensor> opt(c.optimizer.begin(), c.optimizer.end());
    at::NoGradGuard no_grad;
    for (auto& slot : optimizer_->slots()) {
      for (auto [prefix, target] : {std::pair<const char*, at::Tensor*>{"exp_avg.", &slot.exp_avg},
                                    {"exp_avg_sq.", &slot.exp_avg_sq}}) {
        auto it = opt.find(prefix + slot.name);
        if (it == opt.end())
          throw CheckpointError(fmt::format("{}: optimizer state has no '{}{}'", dir, prefix, slot.name));
        if (it->second.sizes() != target->sizes())
          throw CheckpointError(fmt::format("{}: optimizer state '{}{}' has the wrong shape", dir, prefix, slot.name));
        target->copy_(it->second);
      }
    }
    optimizer_->set_step_count(c.optimizer_step_count);
    return c;
  }

  int64_t state_bytes() const override {
    int64_t bytes = 0;
    for (const auto& p : model_->parameters()) bytes += tensor_bytes(p) + tensor_bytes(p.grad());
    for (const auto& s : optimizer_->slots()) bytes += tensor_bytes(s.exp_avg) + tensor_bytes(s.exp_avg_sq);
    if (ema_)
      for (const auto& p : ema_->model()->parameters()) bytes += tensor_bytes(p);
    return bytes;
  }

 private:
  models::DiT model_;
  Config config_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;
};

}  // namespace

std::unique_ptr<TrainState> make_local_train_state(models::DiT model, const Config& config) {
  return std::make_unique<LocalTrainState>(std::move(model), config);
}

}  // namespace flowtrain::trainer
