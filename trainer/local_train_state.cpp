// TrainState for one process: the model's own parameters are the fp32 master weights.
#include "models/autocast_region.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"
#include "trainer/train_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <map>

namespace flowtrain::trainer {

namespace {

class LocalTrainState : public TrainState {
 public:
  LocalTrainState(std::shared_ptr<models::DiffusionModel> model, const Config& config)
      : model_(std::move(model)), config_(config) {
    AdamWOptions adam{config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay};
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    optimizer_ = std::make_unique<AdamW>(named, adam);
    // The EMA covers every parameter (fixed tables too), so its checkpoint file is a full state dict.
    if (config.train.ema_decay > 0) ema_ = std::make_unique<Ema>(model_->parameters());
  }

  models::DiffusionModel& model() override { return *model_; }

  StepReduction reduce_and_clip(const at::Tensor& local_loss, double max_norm, bool stop_requested) override {
    at::Tensor per_param;
    at::Tensor norm = clip_grad_norm(model_->parameters(), max_norm, &per_param);
    // One process: its own gradients are the global ones, so the norm is the local evidence too.
    return {norm, local_loss, at::full({}, stop_requested ? 1.0 : 0.0), norm, per_param};
  }
  void discard_gradients() override { optimizer_->zero_grad(); }
  std::vector<std::string> parameter_names() const override {
    std::vector<std::string> names;
    for (const auto& item : model_->named_parameters()) names.push_back(item.key());
    return names;
  }
  std::vector<at::Tensor> trainable_tensors() override {
    std::vector<at::Tensor> out;
    for (const auto& p : model_->parameters())
      if (p.requires_grad()) out.push_back(p);
    return out;
  }
  std::vector<std::pair<std::string, double>> parameter_sq_norms(const std::vector<at::Tensor>& tensors) override {
    std::vector<std::pair<std::string, double>> out;
    std::vector<at::Tensor> sums;
    size_t i = 0;
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      const at::Tensor& t = tensors.at(i++);
      out.emplace_back(item.key(), 0.0);
      sums.push_back(t.defined() ? t.detach().to(at::kFloat).pow(2).sum() : at::zeros({}));
    }
    const at::Tensor all = at::stack(sums).to(at::kCPU, at::kDouble);  // one read for all of them
    for (size_t k = 0; k < out.size(); ++k) out[k].second = all[static_cast<int64_t>(k)].item<double>();
    return out;
  }
  void optimizer_step(double lr) override {
    optimizer_->step(lr);
    optimizer_->zero_grad();
  }
  void ema_update(double decay) override {
    if (ema_) ema_->update(model_->parameters(), decay);
  }
  bool has_ema() const override { return ema_ != nullptr; }
  int64_t optimizer_step_count() const override { return optimizer_->step_count(); }

  void with_sampling_model(const std::function<void(const models::VelocityFn&)>& fn) override {
    // The model itself with the EMA values swapped into its parameters (and back): no copy.
    const std::vector<at::Tensor> params = model_->parameters();
    if (ema_) swap_parameter_data(params, ema_->tensors());
    const bool was_training = model_->is_training();
    model_->eval();
    try {
      at::NoGradGuard no_grad;
      models::AutocastRegion autocast(config_.train.bf16_autocast(), device_type());
      fn([this](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& c) {
        return model_->forward(x, t, c);
      });
    } catch (...) {
      model_->train(was_training);
      if (ema_) swap_parameter_data(params, ema_->tensors());
      throw;
    }
    model_->train(was_training);
    if (ema_) swap_parameter_data(params, ema_->tensors());
  }

  void fill_checkpoint(CheckpointContents& c) override {
    c.model = state_dict(*model_);
    if (ema_) {
      const auto names = model_->named_parameters();
      for (size_t i = 0; i < names.size(); ++i) c.ema.emplace_back(names[i].key(), ema_->tensors()[i]);
    }
    for (const auto& slot : optimizer_->slots()) {
      c.optimizer.emplace_back("exp_avg." + slot.name, slot.exp_avg);
      c.optimizer.emplace_back("exp_avg_sq." + slot.name, slot.exp_avg_sq);
    }
    c.optimizer_step_count = optimizer_->step_count();
  }

  CheckpointContents restore(const std::string& dir) override {
    CheckpointContents c = load_checkpoint(dir);  // a sharded checkpoint arrives consolidated
    load_state_dict(*model_, c.model, dir + "/model weights");
    at::NoGradGuard no_grad;
    if (ema_) {
      if (c.ema.empty()) spdlog::warn("{} has no EMA weights; EMA restarts from the current weights", dir);
      const NamedTensors& source = c.ema.empty() ? c.model : c.ema;
      std::map<std::string, at::Tensor> by_name(source.begin(), source.end());
      const auto names = model_->named_parameters();
      for (size_t i = 0; i < names.size(); ++i) {
        auto it = by_name.find(names[i].key());
        if (it == by_name.end())
          throw CheckpointError(fmt::format("{}/{}: no '{}'", dir, c.ema.empty() ? "model" : "EMA weights",
                                            names[i].key()));
        if (it->second.sizes() != ema_->tensors()[i].sizes())
          throw CheckpointError(fmt::format("{}: EMA '{}' has the wrong shape", dir, names[i].key()));
        ema_->tensors()[i].copy_(it->second);
      }
    }
    std::map<std::string, at::Tensor> opt(c.optimizer.begin(), c.optimizer.end());
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
      for (const auto& e : ema_->tensors()) bytes += tensor_bytes(e);
    return bytes;
  }

 private:
  c10::DeviceType device_type() const {
    const auto params = model_->parameters();
    return params.empty() ? c10::kCPU : params.front().device().type();
  }

  std::shared_ptr<models::DiffusionModel> model_;
  Config config_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;
};

}  // namespace

std::unique_ptr<TrainState> make_local_train_state(std::shared_ptr<models::DiffusionModel> model,
                                                   const Config& config) {
  return std::make_unique<LocalTrainState>(std::move(model), config);
}

}  // namespace flowtrain::trainer
