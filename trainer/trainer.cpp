#include "trainer/trainer.h"

#include "data/png.h"

#include "trainer/builders.h"
#include "trainer/evaluate.h"
#include "trainer/file_util.h"
#include "trainer/sample_grid.h"
#include "trainer/stop_signal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

namespace fs = std::filesystem;

namespace flowtrain::trainer {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t total = static_cast<int64_t>(s + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02d}m", total / 3600, (total / 60) % 60);
  return fmt::format("{}m{:02d}s", total / 60, total % 60);
}

// bf16 autocast for the forward pass (fp32 master weights and optimizer stay as they are).
struct AutocastScope {
  AutocastScope(bool enabled, c10::DeviceType device) : enabled(enabled), device(device) {
    if (!enabled) return;
    at::autocast::set_autocast_dtype(device, at::kBFloat16);
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device, false);
  }
  bool enabled;
  c10::DeviceType device;
};

}  // namespace

uint64_t step_seed(int64_t run_seed, int64_t rank, int64_t step, int64_t micro) {
  // splitmix64 finaliser over a mix of the four coordinates
  uint64_t z = static_cast<uint64_t>(run_seed) * 0x9E3779B97F4A7C15ull;
  for (int64_t v : {rank, step, micro}) {
    z ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ull + (z << 6) + (z >> 2);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
  }
  return z;
}

Trainer::Trainer(Config config, TrainerHooks hooks) : config_(std::move(config)), hooks_(std::move(hooks)) {
  config_yaml_ = to_yaml(config_);
  // Everything that can fail on bad input (device, data) is checked before the run directory
  // is created, so a rejected run leaves nothing behind.
  device_ = select_device(config_.run);
  dataset_ = build_dataset(config_);
  prepare_run_dir();
  const int threads = configure_threads(config_.train);
  at::manual_seed(static_cast<uint64_t>(config_.run.seed));  // model initialisation
  model_ = build_model(config_.model);
  model_->to(device_);
  const auto dit = model_->options;
  spdlog::info("model: DiT depth {} hidden {} heads {} patch {} on {}×{}×{} ({} tokens): {:.2f}M parameters, "
               "{:.3f} GFLOP per training sample (3× forward)",
               dit.depth, dit.hidden, dit.heads, dit.patch, dit.in_channels, dit.input_size, dit.input_size,
               dit.num_tokens(), models::count_parameters(*model_) / 1e6, models::dit_train_flops_per_sample(dit) / 1e9);
  spdlog::info("device {}, {} CPU threads, precision {}, global batch {} ({} × {} micro-batches)", device_.str(),
               threads, config_.train.precision, config_.data.batch_size,
               config_.data.batch_size / config_.train.grad_accum, config_.train.grad_accum);

  AdamWOptions adam{config_.optim.beta1, config_.optim.beta2, config_.optim.eps, config_.optim.weight_decay};
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
  optimizer_ = std::make_unique<AdamW>(named, adam);
  schedule_ = {config_.optim.lr, config_.optim.warmup_steps, config_.optim.schedule, config_.train.steps,
               config_.optim.min_lr_ratio};
  timesteps_ = timestep_sampler(config_.flow);
  if (config_.train.ema_decay > 0) ema_ = std::make_unique<Ema>(model_);

  const std::string resume = resolve_resume();
  if (!resume.empty()) restore(resume);
  else spdlog::info("starting from scratch (seed {})", config_.run.seed);

  loader_ = std::make_unique<data::Loader>(dataset_, loader_options(config_), progress_.loader);
  metrics_ = std::make_unique<MetricsWriter>((fs::path(config_.run.out_dir) / "metrics.jsonl").string(), progress_.step);
  if (config_.train.tensorboard)
    tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(config_.run.out_dir) / "tb").string());
  if (config_.profile.enabled)
    profiler_ = std::make_unique<StepProfiler>(config_.profile, config_.run.out_dir, /*rank=*/0, device_.is_cuda());
  all_finite_ = at::ones({}, at::TensorOptions().dtype(at::kBool).device(device_));
}

void Trainer::prepare_run_dir() {
  const fs::path dir = config_.run.out_dir;
  fs::create_directories(dir / "checkpoints");
  fs::create_directories(dir / "samples");
  setup_logging((dir / "log.txt").string());
  write_file_atomic((dir / "config.yaml").string(), config_yaml_);
  spdlog::info("flowtrain {} — run '{}' in {}", FLOWTRAIN_VERSION, config_.run.name, dir.string());
}

std::string Trainer::resolve_resume() const {
  const std::string& resume = config_.checkpoint.resume;
  const std::string checkpoints = (fs::path(config_.run.out_dir) / "checkpoints").string();
  prune_checkpoints(checkpoints, /*keep=*/0);  // only removes leftovers of interrupted saves
  if (resume == "never") return "";
  if (resume == "auto") {
    auto latest = find_latest_checkpoint(checkpoints, [](const std::string& w) { spdlog::warn("{}", w); });
    return latest.value_or("");
  }
  return resume;  // an explicit path: any problem with it is an error, not a fallback
}

void Trainer::restore(const std::string& dir) {
  CheckpointContents c = load_checkpoint(dir);
  load_state_dict(*model_, c.model, dir + "/model.safetensors");
  if (ema_) {
    if (c.ema.empty()) spdlog::warn("{} has no EMA weights; EMA restarts from the current weights", dir);
    load_state_dict(*ema_->model(), c.ema.empty() ? c.model : c.ema, dir + "/ema.safetensors");
  }
  std::map<std::string, at::Tensor> opt;
  for (auto& [k, v] : c.optimizer) opt[k] = v;
  at::NoGradGuard no_grad;
  for (auto& slot : optimizer_->slots()) {
    for (auto [prefix, target] : {std::pair<const char*, at::Tensor*>{"exp_avg.", &slot.exp_avg},
                                  {"exp_avg_sq.", &slot.exp_avg_sq}}) {
      auto it = opt.find(prefix + slot.name);
      if (it == opt.end())
        throw CheckpointError(fmt::format("{}/optimizer.safetensors: missing '{}{}'", dir, prefix, slot.name));
      if (it->second.sizes() != target->sizes())
        throw CheckpointError(fmt::format("{}/optimizer.safetensors: '{}{}' has the wrong shape", dir, prefix, slot.name));
      target->copy_(it->second);
    }
  }
  optimizer_->set_step_count(c.optimizer_step_count);
  for (auto& [name, state] : c.rng) {
    if (name == "cpu") {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle sharing the global state
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
  progress_ = c.progress;
  last_checkpoint_step_ = progress_.step;
  spdlog::info("resumed from {} at step {} (epoch {}, position {})", dir, progress_.step, progress_.loader.epoch,
               progress_.loader.position);
}

Trainer::StepResult Trainer::train_step() {
  const int64_t accum = config_.train.grad_accum;
  const auto t_data = Clock::now();
  data::Batch batch = [&] {
    ProfileRange range("data_wait");
    return loader_->next();
  }();
  StepResult r{at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_)), {}, seconds_since(t_data)};
  at::Tensor images = batch.images.to(device_), labels = batch.labels.to(device_);
  const int64_t micro = images.size(0) / accum;

  models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
    return model_->forward(x, t, y);
  };
  for (int64_t m = 0; m < accum; ++m) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(step_seed(config_.run.seed, 0, progress_.step, m));
    at::Tensor loss;
    {
      ProfileRange range("forward");
      AutocastScope autocast(config_.train.precision == "bf16", device_.type());
      loss = models::flow_matching_loss(velocity, images.narrow(0, m * micro, micro), labels.narrow(0, m * micro, micro),
                                        timesteps_, config_.model.class_dropout, config_.model.num_classes, gen)
                 .loss;
    }
    {
      ProfileRange range("backward");
      (loss / accum).backward();
    }
    r.loss += loss.detach() / accum;
  }
  ProfileRange range("optimizer");
  r.grad_norm = clip_grad_norm(model_->parameters(), config_.optim.grad_clip);
  all_finite_.logical_and_(at::isfinite(r.loss).logical_and(at::isfinite(r.grad_norm)));

  progress_.lr = schedule_.lr_at(progress_.step);
  optimizer_->step(progress_.lr);
  optimizer_->zero_grad();
  if (ema_) ema_->update(model_, Ema::decay_at(config_.train.ema_decay, config_.train.ema_warmup, progress_.step));
  progress_.step += 1;
  progress_.samples_seen += images.size(0);
  progress_.loader = batch.state_after;
  return r;
}

void Trainer::check_finite(const char* when) {
  if (all_finite_.item<bool>()) return;
  throw TrainingError(fmt::format("non-finite loss or gradient norm at or before step {} (checked {}); "
                                  "stopping without saving — the last checkpoint in {}/checkpoints is intact",
                                  progress_.step, when, config_.run.out_dir));
}

void Trainer::write_checkpoint() {
  check_finite("before checkpoint");
  ProfileRange range("checkpoint");
  const auto t0 = Clock::now();
  CheckpointContents c;
  c.model = state_dict(*model_);
  if (ema_) c.ema = state_dict(*ema_->model());
  for (const auto& slot : optimizer_->slots()) {
    c.optimizer.emplace_back("exp_avg." + slot.name, slot.exp_avg);
    c.optimizer.emplace_back("exp_avg_sq." + slot.name, slot.exp_avg_sq);
  }
  c.rng.emplace_back("cpu", at::detail::getDefaultCPUGenerator().get_state());
  c.progress = progress_;
  c.optimizer_step_count = optimizer_->step_count();
  c.config_yaml = config_yaml_;
  const std::string checkpoints = (fs::path(config_.run.out_dir) / "checkpoints").string();
  const std::string path = save_checkpoint(checkpoints, c);
  prune_checkpoints(checkpoints, config_.checkpoint.keep);
  last_checkpoint_step_ = progress_.step;
  spdlog::info("checkpoint {} written in {:.2f} s", path, seconds_since(t0));
}

void Trainer::write_samples() {
  check_finite("before sampling");
  ProfileRange range("sample");
  const auto t0 = Clock::now();
  models::DiT& model = ema_ ? ema_->model() : model_;
  at::Tensor samples = generate_samples(model, config_.sample, config_.flow, dataset_->num_classes, device_);
  const std::string path =
      (fs::path(config_.run.out_dir) / "samples" / fmt::format("step-{:07d}.png", progress_.step)).string();
  at::Tensor grid = sample_grid_image(samples, dataset_->num_classes);
  data::write_png(path, grid);
  if (tensorboard_) tensorboard_->add_image("samples", grid, progress_.step);
  spdlog::info("samples {} ({} images, {} {} steps, cfg {}) in {:.1f} s", path, config_.sample.num,
               config_.sample.sampler, config_.sample.steps, config_.sample.cfg_scale, seconds_since(t0));
}

void Trainer::evaluate() {
  check_finite("before evaluation");
  ProfileRange range("eval");
  const auto t0 = Clock::now();
  models::DiT& model = ema_ ? ema_->model() : model_;
  QualityReport q = evaluate_model(model, config_, device_);
  const std::map<std::string, double> values = {{"eval_fd", q.fd},
                                                {"eval_fd_floor", q.fd_floor},
                                                {"eval_class_accuracy", q.class_accuracy},
                                                {"eval_inception_score", q.inception_score}};
  metrics_->write(progress_.step, values);
  if (tensorboard_) tensorboard_->add_scalars(values, progress_.step);
  spdlog::info("eval at step {} ({} samples, {} weights): FD {:.3f} (real-vs-real floor {:.3f}) | class accuracy "
               "{:.1f}% | IS {:.2f} | {:.1f} s",
               progress_.step, q.num, ema_ ? "EMA" : "raw", q.fd, q.fd_floor, 100 * q.class_accuracy,
               q.inception_score, seconds_since(t0));
}

void Trainer::log_step(const StepResult& r, double step_time, double data_wait) {
  const int64_t step = progress_.step, total = config_.train.steps;
  const float loss = r.loss.item<float>();  // host sync only on log steps
  const float grad_norm = r.grad_norm.item<float>();
  const double samples_per_s = config_.data.batch_size / step_time;
  spdlog::info("step {:>{}}/{} | loss {:.4f} | grad_norm {:.3f} | lr {:.2e} | {:.1f} samples/s | "
               "{:.3f} s/step (data {:.0f}%) | ETA {}",
               step, std::to_string(total).size(), total, loss, grad_norm, progress_.lr, samples_per_s, step_time,
               100.0 * data_wait / step_time, format_duration((total - step) * step_time));
  const std::map<std::string, double> values = {{"loss", loss},
                                                {"grad_norm", grad_norm},
                                                {"lr", progress_.lr},
                                                {"samples_per_s", samples_per_s},
                                                {"step_time_s", step_time},
                                                {"data_wait_s", data_wait},
                                                {"compute_s", step_time - data_wait},
                                                {"epoch", double(progress_.loader.epoch)},
                                                {"samples_seen", double(progress_.samples_seen)}};
  metrics_->write(step, values);
  if (tensorboard_) tensorboard_->add_scalars(values, step);
  check_finite("at log step");
}

int64_t Trainer::run() {
  const int64_t total = config_.train.steps;
  if (progress_.step >= total) {
    spdlog::info("nothing to do: step {} >= train.steps {}", progress_.step, total);
    return progress_.step;
  }
  install_stop_signal_handlers();
  model_->train();
  spdlog::info("training steps {} → {}", progress_.step, total);

  // Time of the training steps since the last log line; periodic eval / samples / checkpoints
  // are not counted, so samples/s and ETA describe training itself.
  double window_time = 0;
  int64_t window_steps = 0;
  double window_data_wait = 0;
  while (progress_.step < total) {
    const auto step_start = Clock::now();
    if (profiler_) profiler_->step_begin(progress_.step + 1);
    StepResult r = train_step();
    if (profiler_) profiler_->step_end(progress_.step);
    if (hooks_.on_step) {
      const double loss = r.loss.item<double>();  // synchronises the device: the time is real
      hooks_.on_step({progress_.step, seconds_since(step_start), r.data_wait_s, loss});
    }
    const int64_t step = progress_.step;
    const bool last = step == total;
    const bool log_now = step % config_.train.log_every == 0 || step == 1 || last;
    if (log_now) r.loss.item<float>();  // wait for the device, so the window's time is real
    window_time += seconds_since(step_start);
    ++window_steps;
    window_data_wait += r.data_wait_s;

    if (log_now) {
      log_step(r, window_time / window_steps, window_data_wait / window_steps);
      window_time = 0;
      window_steps = 0;
      window_data_wait = 0;
    }
    if (config_.eval.every > 0 && (step % config_.eval.every == 0 || last)) evaluate();
    if (config_.sample.every > 0 && (step % config_.sample.every == 0 || last)) write_samples();
    if ((config_.checkpoint.every > 0 && step % config_.checkpoint.every == 0) || (last && hooks_.final_checkpoint))
      write_checkpoint();
    if (int sig = stop_signal()) {
      spdlog::warn("received signal {}: checkpointing at step {} and stopping", sig, step);
      if (last_checkpoint_step_ != step) write_checkpoint();
      return step;
    }
  }
  spdlog::info("done: {} steps, {} samples seen", progress_.step, progress_.samples_seen);
  return progress_.step;
}

}  // namespace flowtrain::trainer
