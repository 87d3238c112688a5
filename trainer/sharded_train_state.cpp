// TrainState under FSDP: the model's family parallelised it (trainer/parallelize.h); AdamW and
// the EMA see only this rank's fp32 shards of its units.
#include "models/autocast_region.h"
#include "parallel/fsdp.h"
#include "trainer/ema.h"
#include "trainer/optimizer.h"
#include "trainer/checkpoint/shard_layout.h"
#include "trainer/train_state.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace flowtrain::trainer {

namespace {

class ShardedTrainState : public TrainState {
 public:
  ShardedTrainState(std::shared_ptr<models::DiffusionModel> model, const Config& config, parallel::Runtime& runtime,
                    Parallelized parallelized)
      : model_(std::move(model)), config_(config), runtime_(runtime), fsdp_(std::move(parallelized.fsdp)) {
    if (!fsdp_) throw std::logic_error("ShardedTrainState: the model was parallelised without FSDP");
    layout_.num_shards = runtime.shard_group().size();
    layout_.units = fsdp_->layout();
    for (const auto& item : model_->named_parameters()) layout_.order.push_back(item.key());

    AdamWOptions adam{config.optim.beta1, config.optim.beta2, config.optim.eps, config.optim.weight_decay};
    optimizer_ = std::make_unique<AdamW>(fsdp_->named_shards(), adam);
    if (config.train.ema_decay > 0) ema_ = std::make_unique<Ema>(shards());
  }

  models::DiffusionModel& model() override { return *model_; }

  void begin_micro_batch(bool last_of_step) override {
    fsdp_->set_gradient_sync(last_of_step);
    fsdp_->begin_forward();
  }
  void end_micro_batch() override { fsdp_->finish_backward(); }

  StepReduction reduce_and_clip(const at::Tensor& local_loss, double max_norm, bool stop_requested) override {
    at::NoGradGuard no_grad;
    // One all-reduce over the world carries three numbers: Σ‖g_shard‖² (each shard is held by
    // dp_replicate identical replicas, hence the division), the loss mean over the
    // data-parallel ranks (context ranks compute the same loss: divided by cp too), and the
    // stop votes.
    const auto& shape = runtime_.mesh().shape();
    at::Tensor sumsq = at::zeros({}, local_loss.options().dtype(at::kFloat));
    for (const auto& [name, s] : fsdp_->named_shards())
      if (s.grad().defined()) sumsq = sumsq + s.grad().to(at::kFloat).pow(2).sum();
    at::Tensor packed = at::stack({sumsq / double(shape.dp_replicate),
                                   local_loss.to(at::kFloat) / double(runtime_.mesh().data_parallel() * shape.cp),
                                   at::full({}, stop_requested ? 1.0 : 0.0, sumsq.options())});
    runtime_.world_group().all_reduce(packed, parallel::ReduceOp::Sum)->wait();
    at::Tensor norm = packed[0].sqrt();
    if (max_norm > 0) {
      const at::Tensor coef = clip_coefficient(norm, max_norm);
      for (const auto& [name, s] : fsdp_->named_shards())
        if (s.grad().defined()) s.grad().mul_(coef);
    }
    at::Tensor local = fsdp_->take_local_gradient_sum();
    if (!local.defined()) local = at::zeros({}, sumsq.options());
    return {norm, packed[1], packed[2], local, at::Tensor()};
  }

  void discard_gradients() override { optimizer_->zero_grad(); }
  std::vector<std::string> parameter_names() const override { return layout_.order; }

  std::vector<at::Tensor> trainable_tensors() override { return shards(); }
  std::vector<std::pair<std::string, double>> parameter_sq_norms(const std::vector<at::Tensor>& tensors) override {
    // Each rank sums the squares of every parameter's slice in its shards; the world sum counts
    // each slice once per holder (dp_replicate replicas × cp context ranks), hence the division.
    at::NoGradGuard no_grad;
    const int64_t shard_rank = runtime_.shard_group().rank();
    std::vector<std::pair<std::string, double>> out;
    std::vector<at::Tensor> sums;
    for (size_t u = 0; u < layout_.units.size(); ++u) {
      const parallel::FsdpUnitLayout& unit = layout_.units[u];
      const at::Tensor& t = tensors.at(u);
      for (const auto& p : unit.params) {
        out.emplace_back(p.name, 0.0);
        const parallel::ShardPart part = parallel::shard_part(unit, p, shard_rank);
        sums.push_back(t.defined() && part.count > 0 ? t.narrow(0, part.begin, part.count).to(at::kFloat).pow(2).sum()
                                                     : at::zeros({}, tensors.front().options().dtype(at::kFloat)));
      }
    }
    at::Tensor all = at::stack(sums);
    runtime_.world_group().all_reduce(all, parallel::ReduceOp::Sum)->wait();
    const auto& shape = runtime_.mesh().shape();
    all = (all.to(at::kCPU, at::kDouble) / double(shape.dp_replicate * shape.cp)).contiguous();
    for (size_t k = 0; k < out.size(); ++k) out[k].second = all.data_ptr<double>()[k];
    return out;
  }

  std::vector<std::string> nonfinite_gradients() override {
    // Each rank flags the parameters whose part of its shards is non-finite, in unit order (a
    // block's fp8 all-gather weights after its other parameters); MAX over the world joins them.
    at::NoGradGuard no_grad;
    const int64_t shard_rank = runtime_.shard_group().rank();
    const auto shards = fsdp_->named_shards();
    std::vector<std::string> names;
    std::vector<at::Tensor> flags;
    for (size_t u = 0; u < layout_.units.size() && u < shards.size(); ++u) {
      const parallel::FsdpUnitLayout& unit = layout_.units[u];
      const at::Tensor& grad = shards[u].second.grad();
      for (const auto& p : unit.params) {
        names.push_back(p.name);
        const parallel::ShardPart part = parallel::shard_part(unit, p, shard_rank);
        flags.push_back(grad.defined() && part.count > 0
                            ? at::logical_not(at::isfinite(grad.narrow(0, part.begin, part.count)).all()).to(at::kFloat)
                            : at::zeros({}, shards[u].second.options().dtype(at::kFloat)));
      }
    }
    std::vector<std::string> out;
    if (flags.empty()) return out;
    at::Tensor all = at::stack(flags);  // one collective and one read for every parameter
    runtime_.world_group().all_reduce(all, parallel::ReduceOp::Max)->wait();
    all = all.cpu();
    for (size_t k = 0; k < names.size(); ++k)
      if (all.data_ptr<float>()[k] > 0) out.push_back(names[k]);
    return out;
  }

  void optimizer_step(double lr) override {
    optimizer_->step(lr);
    optimizer_->zero_grad();
  }
  void ema_update(double decay) override {
    if (ema_) ema_->update(shards(), decay);
  }
  bool has_ema() const override { return ema_ != nullptr; }
  int64_t optimizer_step_count() const override { return optimizer_->step_count(); }

  void with_sampling_model(const std::function<void(const models::VelocityFn&)>& fn) override {
    // The sharded model itself, with the EMA shards swapped in: every forward gathers one unit at
    // a time (and releases it), as in training, so sampling never holds a full copy.
    if (ema_) fsdp_->swap_shards(ema_->tensors());
    const bool was_training = model_->is_training();
    model_->eval();
    {
      at::NoGradGuard no_grad;
      models::AutocastRegion autocast(config_.train.bf16_autocast(), shards().front().device().type());
      fn([this](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& c) {
        fsdp_->begin_forward();
        return model_->forward(x, t, c);
      });
    }
    model_->train(was_training);
    fsdp_->reshard_all();
    if (ema_) fsdp_->swap_shards(ema_->tensors());
  }

  void fill_checkpoint(CheckpointContents& c) override {
    c.model = fsdp_->named_shards();
    if (ema_)
      for (size_t i = 0; i < ema_->tensors().size(); ++i) c.ema.emplace_back(layout_.units[i].name, ema_->tensors()[i]);
    for (const auto& slot : optimizer_->slots()) {
      c.optimizer.emplace_back("exp_avg." + slot.name, slot.exp_avg);
      c.optimizer.emplace_back("exp_avg_sq." + slot.name, slot.exp_avg_sq);
    }
    c.optimizer_step_count = optimizer_->step_count();
    c.world_size = runtime_.world();
    ShardedContents sh;
    sh.layout = layout_;
    sh.shard_index = runtime_.shard_group().rank();
    sh.writer = runtime_.mesh().coord(runtime_.rank()).replicate == 0;  // the shard group of replica 0
    for (const auto& item : model_->named_parameters())
      if (!item.value().requires_grad()) sh.fixed.emplace_back(item.key(), item.value().detach());
    c.sharded = std::move(sh);
  }

  CheckpointContents restore(const std::string& dir) override {
    const int64_t index = runtime_.shard_group().rank();
    CheckpointContents c;
    NamedTensors model, ema, optimizer;
    if (checkpoint_num_shards(dir) == layout_.num_shards && same_units(load_checkpoint_layout(dir))) {
      c = load_checkpoint_shard(dir, index);  // written by this layout: read our files only
      model = c.model;
      ema = c.ema;
      optimizer = c.optimizer;
      for (const auto& [name, t] : c.sharded->fixed) set_fixed(name, t);
    } else {
      // Another world size, other units, or an unsharded run: consolidate, then cut this rank's shards.
      c = load_checkpoint(dir);
      spdlog::info("{} was written with {} shard(s) in other units or another number; re-sharding it for {}", dir,
                   checkpoint_num_shards(dir), layout_.num_shards);
      model = cut_shard(layout_, c.model, "", index, dir);
      if (!c.ema.empty()) ema = cut_shard(layout_, c.ema, "", index, dir);
      for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
        for (auto& item : cut_shard(layout_, c.optimizer, prefix, index, dir)) optimizer.push_back(std::move(item));
      for (const auto& [name, t] : c.model)
        if (!is_sharded(name)) set_fixed(name, t);
    }
    at::NoGradGuard no_grad;
    auto shards = fsdp_->named_shards();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string& unit = shards[i].first;
      shards[i].second.copy_(find(model, unit, dir));
      if (ema_) {
        if (ema.empty()) ema_->tensors()[i].copy_(shards[i].second);
        else ema_->tensors()[i].copy_(find(ema, unit, dir));
      }
    }
    for (auto& slot : optimizer_->slots()) {
      slot.exp_avg.copy_(find(optimizer, "exp_avg." + slot.name, dir));
      slot.exp_avg_sq.copy_(find(optimizer, "exp_avg_sq." + slot.name, dir));
    }
    optimizer_->set_step_count(c.optimizer_step_count);
    return c;
  }

  int64_t state_bytes() const override {
    int64_t bytes = fsdp_->shard_bytes();
    for (const auto& s : optimizer_->slots()) bytes += tensor_bytes(s.exp_avg) + tensor_bytes(s.exp_avg_sq);
    if (ema_)
      for (const auto& e : ema_->tensors()) bytes += tensor_bytes(e);
    return bytes;
  }

 private:
  bool same_units(const std::optional<ShardLayout>& theirs) const {
    if (!theirs || theirs->units.size() != layout_.units.size()) return false;
    // Parameter by parameter: which parameters a unit holds can depend on the run (fp8.include
    // decides what goes to a '<unit>.fp8' sibling), and equal sizes do not mean equal places.
    for (size_t i = 0; i < theirs->units.size(); ++i) {
      const parallel::FsdpUnitLayout &a = theirs->units[i], &b = layout_.units[i];
      if (a.name != b.name || a.numel != b.numel || a.params.size() != b.params.size()) return false;
      for (size_t k = 0; k < a.params.size(); ++k)
        if (a.params[k].name != b.params[k].name || a.params[k].offset != b.params[k].offset ||
            a.params[k].shape != b.params[k].shape)
          return false;
    }
    return true;
  }
  bool is_sharded(const std::string& name) const {
    for (const auto& u : layout_.units)
      for (const auto& p : u.params)
        if (p.name == name) return true;
    return false;
  }
  void set_fixed(const std::string& name, const at::Tensor& t) {
    at::NoGradGuard no_grad;
    for (const auto& item : model_->named_parameters())
      if (item.key() == name && !item.value().requires_grad()) item.value().copy_(t);
  }
  static const at::Tensor& find(const NamedTensors& tensors, const std::string& name, const std::string& dir) {
    for (const auto& [n, t] : tensors)
      if (n == name) {
        return t;
      }
    throw CheckpointError(fmt::format("{}: missing '{}'", dir, name));
  }

  std::vector<at::Tensor> shards() const {
    std::vector<at::Tensor> out;
    for (const auto& [name, s] : fsdp_->named_shards()) out.push_back(s);
    return out;
  }

  std::shared_ptr<models::DiffusionModel> model_;
  Config config_;
  parallel::Runtime& runtime_;
  std::unique_ptr<parallel::FullyShardedModule> fsdp_;
  ShardLayout layout_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<Ema> ema_;  // one fp32 shard per unit, like the master shards
};

}  // namespace

std::unique_ptr<TrainState> make_sharded_train_state(
    std::shared_ptr<models::DiffusionModel> model, const Config& config, parallel::Runtime& runtime,
    Parallelized parallelized) {
  return std::make_unique<ShardedTrainState>(std::move(model), config, runtime, std::move(parallelized));
}

}  // namespace flowtrain::trainer
