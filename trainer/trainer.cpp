#include "trainer/trainer.h"

#include "trainer/fp8_setup.h"

#include "trainer/data_source.h"
#include "data/shards/shard_loader.h"

#include "data/png.h"
#include "data/splitmix64.h"
#include "models/autocast_region.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/context.h"
#include "parallel/gather.h"

#include "trainer/builders.h"
#include "trainer/config/resolve.h"
#include "trainer/family.h"
#include "trainer/frozen/frozen_files.h"
#include "trainer/ema.h"
#include "trainer/eval/evaluate.h"
#include "trainer/eval/evaluator.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/checkpoint/state_dict.h"
#include "trainer/telemetry/memory_stats.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/health/batch_ordinals.h"
#include "parallel/comm.h"
#include "trainer/stop_signal.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <exception>
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

// Whether CheckpointController::resume_point() will look for a checkpoint: resume "auto" with a committed
// step-N directory, or an explicit one.
bool has_checkpoints_to_resume(const Config& c) {
  if (c.checkpoint.resume == "never") return false;
  if (c.checkpoint.resume != "auto") return true;  // an explicit checkpoint
  return !committed_checkpoints((fs::path(c.run.out_dir) / "checkpoints").string()).empty();
}

}  // namespace

uint64_t step_seed(int64_t run_seed, int64_t rank, int64_t step, int64_t micro) {
  // splitmix64's mix over a hash-combine of the four coordinates
  uint64_t z = static_cast<uint64_t>(run_seed) * data::kGoldenGamma;
  for (int64_t v : {rank, step, micro})
    z = data::splitmix64_mix(z ^ (static_cast<uint64_t>(v) + data::kGoldenGamma + (z << 6) + (z >> 2)));
  return z;
}

models::FlowMatchingDraw draw_step_inputs(const Config& c, const models::TimestepSampler& timesteps,
                                          const models::ConditioningDropout& dropout, const at::Tensor& x0,
                                          const models::Conditioning& cond, int64_t step, int64_t first_row) {
  const int64_t seed = c.run.seed;
  if (x0.is_cuda()) {
    // On the GPU: one Philox generator per (seed, step, slice), drawing the slice's t, noise and
    // dropout on the device (per-row CPU generators would cost a host loop and a copy per step).
    // Deterministic for a given data-parallel layout — a resume at the same layout draws the same —
    // but a different layout splits the batch differently and so draws other (equally distributed)
    // noise. rank slot 1 keeps these seeds apart from the CPU path's per-row ones.
    at::Generator gen = at::detail::getCUDAHooks().getNewGenerator(x0.device().index());
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(step_seed(seed, /*rank=*/1, step, /*micro=*/first_row));
    }
    return models::draw_flow_matching_inputs(x0, cond, timesteps, dropout, gen);
  }
  return models::draw_flow_matching_inputs_per_row(
      x0, cond, timesteps, dropout, [seed, step](int64_t row) { return step_seed(seed, /*rank=*/0, step, /*micro=*/row); },
      first_row);
}

Trainer::Trainer(Config config, TrainerHooks hooks) : config_(std::move(config)), hooks_(std::move(hooks)) {
  config_yaml_ = to_yaml(config_);
  // Everything that can fail on bad input (launch environment, mesh, device, data) is checked
  // before the run directory is created, so a rejected run leaves nothing behind.
  env_ = parallel::resolve_dist_env_from_process();
  const ResolvedRun resolved = resolve(config_, this_environment(env_));  // mesh, batch split, device, threads
  const bool distributed = resolved.sharded;
  dp_size_ = resolved.data_parallel;
  dp_rank_ = parallel::Mesh(resolved.mesh, env_.world).data_parallel_rank(env_.rank);
  device_ = select_device(config_.run, env_.local_rank);
  configure_cuda(device_, config_.train);  // bound before the first collective
  check_frozen_inputs(config_);  // the frozen files against the model's shapes, before any data is read
  if (has_frozen_files(config_.model)) {
    const auto t_digest = Clock::now();
    frozen_files_ = frozen_file_records(config_.model);  // recorded in checkpoints, checked at a resume
    spdlog::info("frozen files: {} digested in {:.1f} s", frozen_files_.size(), seconds_since(t_digest));
  }
  std::shared_ptr<const data::ImageDataset> dataset = build_dataset(config_);
  if (encodes_dataset_once(config_)) dataset = encode_dataset_once(config_, dataset, device_);
  online_ = OnlineEncoder::for_run(config_, device_);  // frozen models the step runs; null when none
  // The model, from its family (trainer/family.h); initialised from the run seed, so
  // identical on every rank. Built before the run directory: its shape decides the checks below.
  at::manual_seed(static_cast<uint64_t>(config_.run.seed));
  const FamilySpec& family = model_family(config_.model.arch);
  conditioning_ = run_conditioning(config_, dataset);
  if (family.objective) objective_ = &*family.objective;
  std::shared_ptr<models::DiffusionModel> model = family.build(config_.model);
  // train.init_from seeds a fresh run only: a run with checkpoints to resume from never re-reads
  // the file (it may be gone, and the checkpoint has the weights). Loaded before anything is
  // written, so a file that does not fit stops the run here.
  const bool init_from = !config_.train.init_from.empty() && !has_checkpoints_to_resume(config_);
  if (init_from) {
    load_weights_file(*model, config_.train.init_from, exported_parts(config_.model).front());
    spdlog::info("initial weights from {}", config_.train.init_from);
  }
  // Checked before anything is written; the family's parallelize installs it below.
  std::optional<parallel::ContextAttention> cp_attention;
  if (config_.parallel.cp > 1) cp_attention = context_attention_kind(config_, *model);
  fp8_ = apply_fp8(*model, config_, device_);  // before sharding: FSDP gathers into the same modules
  // fp8.all_gather's checks (recipe, sharding) before anything is written.
  auto fp8_gathered = fp8_all_gather_weights(fp8_, config_, distributed);
  if (config_.eval.every > 0) {  // every rank, up front
    evaluator_ = make_evaluator(config_);
    evaluator_->check(config_, *model);
  }
  if (distributed) {
    parallel::RuntimeOptions ro{env_, resolved.mesh, resolved.backend, config_.parallel.timeout_s, device_};
    runtime_ = parallel::Runtime::create(ro);  // rendezvous: every rank arrives or all fail
  }
  prepare_run_dir();
  TrainConfig threading = config_.train;
  threading.threads = resolved.threads;
  const int threads = configure_threads(threading);
  model->to(device_);
  spdlog::info("model: {}: {:.2f}M parameters, {:.3f} GFLOP per training sample (3× forward)", model->describe(),
               models::count_parameters(*model) / 1e6, model->train_flops_per_sample() / 1e9);
  spdlog::info("device {}, {} CPU threads, precision {}, global batch {} ({} data-parallel ranks × {} micro-batches "
               "× {})",
               device_.str(), threads, name_of(config_.train.precision), config_.data.batch_size, dp_size_,
               config_.train.grad_accum, config_.data.batch_size / (dp_size_ * config_.train.grad_accum));
  for (const std::string& line : fp8_log_lines(fp8_, config_, device_)) spdlog::info("{}", line);
  // Context parallelism, FSDP and activation checkpointing, as the model's family orders them.
  Parallelized parallelized =
      family.parallelize(*model, {&config_, runtime_.get(), std::move(fp8_gathered), cp_attention});
  if (runtime_)
    state_ = make_sharded_train_state(model, config_, *runtime_, std::move(parallelized));
  else
    state_ = make_local_train_state(model, config_);
  log_parallel_layout(*model, cp_attention);
  schedule_ = {config_.optim.lr, config_.optim.warmup_steps, config_.optim.schedule, config_.train.steps,
               config_.optim.min_lr_ratio};
  timesteps_ = timestep_sampler(config_);

  faults_ = std::make_unique<FaultInjector>(config_.debug, env_.rank);
  make_checkpoint_controller();
  const std::string resume = checkpoints_->resume_point();
  if (!resume.empty()) {
    restore(resume);
  } else {
    if (!config_.train.init_from.empty() && !init_from)  // every checkpoint there failed verification
      throw CheckpointError(fmt::format("{}/checkpoints: no checkpoint verifies, and the run's initial weights "
                                        "(train.init_from {}) were not loaded because checkpoints were expected; "
                                        "move the directory aside to start afresh",
                                        config_.run.out_dir, config_.train.init_from));
    spdlog::info("starting from scratch (seed {})", config_.run.seed);
  }

  DataPlacement placement{env_.rank, dp_rank_, dp_size_, /*data_lead=*/true, device_, nullptr};
  if (runtime_) {
    const auto group = runtime_->mesh().context_group(env_.rank);
    placement.data_lead = env_.rank == *std::min_element(group.begin(), group.end());
    placement.world = &runtime_->world_group();
  }
  data_ = std::make_unique<DataSession>(config_, std::move(dataset), placement);
  for (int64_t b : parse_batch_ordinals(config_.data.skip_batches, "data.skip_batches"))
    progress_.skip_batches.insert(b);
  data_->start(progress_);
  if (lead()) {
    metrics_ = std::make_unique<MetricsWriter>((fs::path(config_.run.out_dir) / "metrics.jsonl").string(), progress_.step);
    if (config_.train.tensorboard)
      tensorboard_ = std::make_unique<TensorBoardWriter>((fs::path(config_.run.out_dir) / "tb").string());
  }
  if (config_.profile.enabled)
    profiler_ = std::make_unique<StepProfiler>(config_.profile, config_.run.out_dir, static_cast<int>(env_.rank),
                                               device_.is_cuda());
  faults_->attach(state_->model());
  health_ = std::make_unique<HealthMonitor>(config_.health, health_wiring());
  telemetry_ = BlockTelemetry(config_.health.telemetry_every);
  health_->set_skipped_updates(progress_.skipped_updates);
  if (progress_.step > 0) health_->record_event(progress_.step, "resume");
  if (!lead()) spdlog::set_level(spdlog::level::warn);  // rank 0 narrates; the others speak up on problems
}

void Trainer::log_parallel_layout(const models::DiffusionModel& model,
                                  std::optional<parallel::ContextAttention> cp_attention) const {
  const int64_t blocks = static_cast<int64_t>(model.units().blocks.size());
  if (runtime_) {
    spdlog::info("FSDP over {} ({} backend): {} block units, stem and head{}, {:.1f} MiB of training state on this rank",
                 runtime_->mesh().describe(), runtime_->backend(), blocks,
                 config_.fp8.all_gather ? " (and their '.fp8' siblings for fp8 all-gather)" : "",
                 state_->state_bytes() / 1048576.0);
    if (cp_attention)
      spdlog::info("context parallelism: {} tokens per sample split over {} ranks ({} per rank), {} attention{}",
                   model.tokens_per_sample(), config_.parallel.cp, model.tokens_per_sample() / config_.parallel.cp,
                   parallel::name(*cp_attention),
                   cp_attention == parallel::ContextAttention::Hybrid ? fmt::format(" (Ulysses over {} adjacent ranks, ring across {} groups)",
                                                          config_.parallel.cp_ulysses,
                                                          config_.parallel.cp / config_.parallel.cp_ulysses)
                                            : "");
  }
  if (config_.train.activation_checkpointing != parallel::RecomputePolicy::none) {
    const parallel::RecomputePolicy mode = config_.train.activation_checkpointing;
    int64_t recomputed = 0;
    for (int64_t i = 0; i < blocks; ++i)  // every_th is the same rule for blocks and sublayers
      recomputed += parallel::checkpoint_block(parallel::RecomputePolicy::full,
                                               config_.train.activation_checkpointing_every, i);
    spdlog::info("activation checkpointing: {}{} of {} blocks recomputed in backward",
                 mode == parallel::RecomputePolicy::full ? "" : "the " + name_of(mode) + " sublayer of ", recomputed,
                 blocks);
  }
}

void Trainer::make_checkpoint_controller() {
  CheckpointWiring w;
  w.rank = env_.rank;
  w.world = env_.world;
  w.runtime = runtime_.get();
  w.final_checkpoint = hooks_.final_checkpoint;
  if (faults_->pauses_checkpoints())
    w.after_first_file = [faults = faults_.get()](int64_t step, const std::string& file) {
      faults->after_first_checkpoint_file(step, file);
    };
  w.record = [this](int64_t step, const std::map<std::string, double>& values) {
    if (metrics_) metrics_->write(step, values);  // metrics_ is replaced at a rollback: read it at the call
  };
  checkpoints_ = std::make_unique<CheckpointController>(config_, std::move(w));
}

HealthMonitor::Wiring Trainer::health_wiring() {
  HealthMonitor::Wiring w;
  w.rank = env_.rank;
  w.world = env_.world;
  w.out_dir = config_.run.out_dir;
  w.param_names = state_->parameter_names();
  w.device = device_;
  // Judged every step where reading two numbers costs nothing extra: the CPU, a multi-rank step
  // (its stop vote is read every step anyway), or where a policy must act before the update.
  const bool acting = config_.health.nonfinite != NonfinitePolicy::stop || config_.health.spike == SpikePolicy::skip ||
                      config_.health.spike == SpikePolicy::rollback;
  w.judge_every_step = runtime_ != nullptr || device_.is_cpu() || acting;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  w.hosts = {host};
  if (runtime_) {
    w.hosts = parallel::gather_string(runtime_->world_group(), host, /*max_bytes=*/64, device_);
    w.gather = [this](const std::vector<double>& values) {
      return parallel::gather_vector(runtime_->world_group(), values, device_);
    };
    w.nonfinite_params = [this] { return state_->nonfinite_gradients(); };
  }
  return w;
}

Trainer::~Trainer() {
  // A save in flight is of a state that was finite when staged: finish it, even when leaving on
  // an error (at world > 1 its commit vote needs the other ranks; a dead one fails it after
  // parallel.timeout_s).
  checkpoints_.reset();
  if (std::uncaught_exceptions() > 0) {
    // Leaving on an error (often a dead peer): tearing down process groups with collectives in
    // flight can block, and the process is about to exit anyway. Let the OS reclaim them.
    (void)state_.release();
    (void)runtime_.release();
    return;
  }
  state_.reset();
  if (runtime_) runtime_->shutdown();
}

int64_t Trainer::dataset_bytes() const { return data_->dataset_bytes(); }

void Trainer::write_rank_report() {
  // Per-rank facts a multi-rank run cannot show in rank 0's log: this rank's memory of training
  // state (counted from the tensors) and where it sat in the mesh.
  const fs::path dir = fs::path(config_.run.out_dir) / "ranks";
  fs::create_directories(dir);
  const MemoryPeaks peaks = memory_peaks(device_);
  nlohmann::json j = {{"rank", env_.rank},
                      {"world", env_.world},
                      {"data_parallel_rank", dp_rank_},
                      {"data_parallel_size", dp_size_},
                      {"sharded", runtime_ != nullptr},
                      {"peak_state_bytes", peak_state_bytes_},
                      {"peak_rss_bytes", peaks.rss_bytes},
                      {"peak_allocated_bytes", peaks.allocated_bytes},
                      {"allocated_kind", peaks.allocated_kind},
                      {"steps", progress_.step}};
  write_file_atomic((dir / fmt::format("rank-{:05d}.json", env_.rank)).string(), j.dump(2));
  spdlog::info("rank {}: peak training state {:.2f} MiB (weights, grads, AdamW, EMA); peak {} {:.1f} MiB, peak RSS "
               "{:.1f} MiB",
               env_.rank, peak_state_bytes_ / 1048576.0, peaks.allocated_kind, peaks.allocated_bytes / 1048576.0,
               peaks.rss_bytes / 1048576.0);
}

std::vector<int64_t> Trainer::gather_from_ranks(int64_t value) {
  if (!runtime_) return {value};
  return parallel::gather_value(runtime_->world_group(), value, device_);
}

void Trainer::barrier() {
  if (runtime_) runtime_->world_group().barrier();
}

void Trainer::prepare_run_dir() {
  const fs::path dir = config_.run.out_dir;
  if (lead()) {
    fs::create_directories(dir / "checkpoints");
    fs::create_directories(dir / "samples");
  }
  barrier();
  // Rank 0 keeps log.txt; the others log to the console only (Slurm/K8s collect it per task).
  setup_logging(lead() ? (dir / "log.txt").string() : "", static_cast<int>(env_.rank));
  if (lead()) write_file_atomic((dir / "config.yaml").string(), config_yaml_);
  spdlog::info("flowtrain {} — run '{}' in {}", FLOWTRAIN_VERSION, config_.run.name, dir.string());
  if (runtime_ || env_.world > 1) spdlog::info("{}", env_.describe());
}

void Trainer::restore(const std::string& dir) {
  CheckpointContents c = state_->restore(dir);
  if (c.frozen_files) check_same_frozen_files(*c.frozen_files, frozen_files_, dir);
  for (auto& [name, state] : c.rng) {
    if (name == "cpu") {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle sharing the global state
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
  }
  try {
    const int64_t restored = models::fp8::restore_amax_histories(fp8_, c.fp8);
    if (restored > 0)
      spdlog::info("fp8 delayed scaling: amax histories of {} linears restored", restored);
    else if (config_.fp8.recipe == models::fp8::Recipe::delayed)
      spdlog::info("fp8 delayed scaling: {} holds no amax histories; scales start from each tensor's own amax", dir);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(fmt::format("{}/fp8.safetensors: {}", dir, e.what()));
  }
  progress_ = c.progress;
  checkpoints_->restored(progress_.step);
  spdlog::info("resumed from {} at step {} (epoch {}, position {})", dir, progress_.step, progress_.loader.epoch,
               progress_.loader.position);
}

Trainer::StepResult Trainer::train_step() {
  const int64_t accum = config_.train.grad_accum;
  const int64_t step = progress_.step + 1;  // the step being taken
  const double comm_at_start = parallel::collective_wait_seconds();
  const auto t_data = Clock::now();
  data::Batch batch = [&] {
    ProfileRange range("data_wait");
    faults_->before_data(step);
    return data_->next(progress_);
  }();
  StepResult r;
  r.loss = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  r.data_wait_s = seconds_since(t_data);
  if (online_) {
    // Synchronised so the phase's time is the encoders' own (the step needs their outputs next anyway).
    const auto t_encode = Clock::now();
    ProfileRange range("frozen_encoders");
    online_->encode(batch);
    synchronize_device(device_);
    r.encode_s = seconds_since(t_encode);
  }
  faults_->begin_step(step);
  const double loss_scale = faults_->loss_scale(step);
  std::vector<at::Tensor> sample_losses;
  // From pinned memory on CUDA: asynchronous copies, ordered before the step's kernels on the stream.
  at::Tensor images = batch.images.to(device_, /*non_blocking=*/true);
  // Clips arrive frame-major [B, T, C, H, W] (data/batch_source.h); a video model takes [B, C, T, H, W].
  if (images.dim() == 5) images = images.permute({0, 2, 1, 3, 4}).contiguous();
  const models::Conditioning cond = conditioning_.of_batch(batch).to(device_, /*non_blocking=*/true);
  const int64_t micro = images.size(0) / accum;
  const int64_t first_row = dp_rank_ * images.size(0);  // this rank's rows of the global batch

  models::DiffusionModel& model = state_->model();
  const models::ConditioningDropout dropout = model.conditioning_dropout();
  models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& c) {
    return model.forward(x, t, c);
  };
  for (int64_t m = 0; m < accum; ++m) {
    at::Tensor x0 = images.narrow(0, m * micro, micro);
    state_->begin_micro_batch(/*last_of_step=*/m == accum - 1);
    at::Tensor loss;
    {
      ProfileRange range("forward");
      models::AutocastRegion autocast(config_.train.bf16_autocast(), device_.type());  // bf16: forward only
      at::Tensor per_sample;
      if (objective_) {  // the family's own objective (trainer/family.h), e.g. the autoencoder's
        const int64_t rows_from = first_row + m * micro;  // global index of x0's first row
        per_sample = objective_->loss(model, config_.model, x0, [&](int64_t row) {
          return step_seed(config_.run.seed, /*rank=*/2, progress_.step, /*micro=*/rows_from + row);
        });
        loss = per_sample.mean();
      } else {
        models::FlowMatchingDraw draw = draw_step_inputs(config_, timesteps_, dropout, x0, cond.rows(m * micro, micro),
                                                         progress_.step, first_row + m * micro);
        models::FlowMatchingLoss fm = models::flow_matching_loss(velocity, x0, draw);
        loss = fm.loss;
        per_sample = models::per_sample_loss(fm);
      }
      if (loss_scale != 1.0) loss = loss * loss_scale;
      const auto t_health = Clock::now();
      sample_losses.push_back(loss_scale == 1.0 ? per_sample.detach() : per_sample.detach() * loss_scale);
      health_seconds_ += seconds_since(t_health);
    }
    {
      ProfileRange range("backward");
      (loss / accum).backward();
    }
    {
      ProfileRange range("communication");
      state_->end_micro_batch();
    }
    r.loss += loss.detach() / accum;
  }
  ProfileRange range("optimizer");
  // A stop is voted with the step's reduction, so every rank stops at the same step: on a signal,
  // or on a failed save under checkpoint.on_error: stop (ranks may see that at different steps).
  const bool stop_requested = stop_signal() != 0 || checkpoints_->stop_requested();
  StepReduction red = state_->reduce_and_clip(r.loss, config_.optim.grad_clip, stop_requested);
  faults_->end_step();
  const auto t_health = Clock::now();
  const at::Tensor local_loss_bad = at::isfinite(r.loss).logical_not();  // this rank's own loss, before the mean
  r.loss = red.loss;
  r.grad_norm = red.grad_norm;
  r.stop = red.stop;
  peak_state_bytes_ = std::max(peak_state_bytes_, state_->state_bytes());  // gradients are all present here
  StepVerdict verdict;
  {
    StepObservation obs;
    obs.step = step;
    obs.batch_ordinal = progress_.batches_drawn;
    obs.loss = red.loss;
    obs.grad_norm = red.grad_norm;
    obs.local_flags = at::stack({local_loss_bad.to(at::kFloat),
                                 at::isfinite(red.local_gradient_sum).logical_not().to(at::kFloat)});
    obs.param_norms = red.param_norms;
    obs.sample_losses = at::cat(sample_losses);
    obs.sample_keys = batch.keys;
    verdict = health_->observe(std::move(obs));
    r.action = verdict.action;
  }
  health_seconds_ += seconds_since(t_health);  // host time; on the CPU it includes the checks' compute
  r.comm_wait_s = parallel::collective_wait_seconds() - comm_at_start;
  if (r.action == HealthAction::Stop)
    throw TrainingError(fmt::format("{} ({}/checkpoints)", verdict.reason, config_.run.out_dir));
  if (r.action == HealthAction::Rollback) return r;  // run() rolls back; nothing of this step is kept
  if (batch.state_after.epoch != progress_.loader.epoch)
    health_->record_event(step, fmt::format("data epoch {}", batch.state_after.epoch));
  if (r.action == HealthAction::Skip) {
    // The batch is consumed and the step counted, but the weights, AdamW and the EMA stay as
    // they were: the skipped update never happened.
    state_->discard_gradients();
    models::fp8::discard_pending_amaxes(fp8_);
    progress_.step += 1;
    progress_.samples_seen += config_.data.batch_size;
    data_->consumed(batch, progress_);
    return r;
  }

  progress_.lr = schedule_.lr_at(progress_.step);
  checkpoints_->before_state_update();  // CUDA: a save's staging copies finish before the update overwrites them
  // Delayed scaling's amaxes join the histories here: after the staging wait (the histories are
  // in a checkpoint too), and only for a step that is kept (all ranks reach the same verdict).
  commit_fp8_amax(fp8_, runtime_ ? &runtime_->world_group() : nullptr);
  const bool telemetry = telemetry_.due(step);
  if (telemetry) telemetry_.before_update(*state_);
  state_->optimizer_step(progress_.lr);
  if (telemetry) {
    const std::map<std::string, double> blocks = telemetry_.after_update(*state_);
    if (metrics_) metrics_->write(step, blocks);
    if (tensorboard_) tensorboard_->add_scalars(blocks, step);
  }
  state_->ema_update(Ema::decay_at(config_.train.ema_decay, config_.train.ema_warmup, progress_.step));
  progress_.step += 1;
  progress_.samples_seen += config_.data.batch_size;
  data_->consumed(batch, progress_);
  return r;
}

void Trainer::check_health(const char* when) {
  const StepVerdict v = health_->judge_pending();
  if (v.action == HealthAction::Stop)
    throw TrainingError(fmt::format("{} (checked {}, at step {}; {}/checkpoints)", v.reason, when, progress_.step,
                                    config_.run.out_dir));
}

void Trainer::rollback(const std::string& reason) {
  const int64_t failed_step = progress_.step + 1, bad_batch = progress_.batches_drawn;
  checkpoints_->finish();  // the newest checkpoint may still be persisting
  const auto latest = checkpoints_->newest_verified();
  if (!latest)
    throw TrainingError(fmt::format("health.{}: rollback at step {} needs a checkpoint and {} has none that "
                                    "verifies; stopping ({})",
                                    "nonfinite/spike", failed_step, checkpoints_->checkpoints_dir(), reason));
  std::set<int64_t> skips = progress_.skip_batches;
  skips.insert(bad_batch);
  state_->discard_gradients();
  restore(*latest);  // the monitor keeps counting skipped updates across it (max_skips is per run)
  progress_.skip_batches.insert(skips.begin(), skips.end());
  data_->start(progress_);
  if (metrics_) metrics_ = std::make_unique<MetricsWriter>((fs::path(config_.run.out_dir) / "metrics.jsonl").string(),
                                                           progress_.step);  // the replayed steps' lines go
  ++rollbacks_;
  health_->after_rollback(progress_.step);
  const std::string what = fmt::format("rolled back from step {} to {} (step {}); batch #{} will be discarded, so the "
                                       "run continues as one that never saw it (rollback {} of this process)",
                                       failed_step, *latest, progress_.step, bad_batch, rollbacks_);
  spdlog::warn("health: {}", what);
  if (lead()) append_health_event(config_.run.out_dir, env_.rank, failed_step, "rollback_done", what);
}

void Trainer::write_checkpoint() {
  check_health("before checkpoint");
  ProfileRange range("checkpoint");
  health_->record_event(progress_.step, "checkpoint");
  CheckpointContents c = checkpoint_tensors();
  c.progress = progress_;
  c.progress.skipped_updates = health_->skipped_updates();
  if (config_.data.source == DataSource::shards) c.progress.shards = data_->merged_shard_state(progress_.loader);
  c.config_yaml = config_yaml_;
  c.frozen_files = frozen_files_;
  c.world_size = env_.world;
  checkpoints_->save(c);
}

CheckpointContents Trainer::checkpoint_tensors() {
  CheckpointContents c;
  state_->fill_checkpoint(c);
  c.rng.emplace_back("cpu", at::detail::getDefaultCPUGenerator().get_state());
  c.fp8 = models::fp8::amax_history_state(fp8_);
  return c;
}

at::Tensor Trainer::sample_rows_on_all_ranks(int64_t total, const std::function<at::Tensor(int64_t, int64_t)>& make) {
  if (!runtime_) return make(0, total);
  // Every data-parallel rank integrates an equal, padded slice (the same number of forward calls
  // everywhere, as the sharded forward needs); the context ranks of one slice compute it together.
  const int64_t per = (total + dp_size_ - 1) / dp_size_;
  const at::Tensor all = parallel::gather_rows(runtime_->world_group(), make(dp_rank_ * per, per).to(device_));
  std::vector<at::Tensor> slices(dp_size_);
  for (int64_t r = env_.world - 1; r >= 0; --r)  // the first world rank of each data-parallel rank
    slices[runtime_->mesh().data_parallel_rank(r)] = all[r];
  return at::cat(slices).narrow(0, 0, total);
}

void Trainer::write_samples() {
  check_health("before sampling");
  ProfileRange range("sample");
  health_->record_event(progress_.step, "sample grid");
  const auto t0 = Clock::now();
  at::Tensor samples;
  state_->with_sampling_model([&](const models::VelocityFn& velocity) {  // under FSDP: every rank
    samples = sample_rows_on_all_ranks(config_.sample.num, [&](int64_t first, int64_t count) {
      return generate_samples(velocity, state_->model(), conditioning_.of_rows, config_, device_, first, count);
    });
  });
  if (lead()) {
    const std::string path =
        (fs::path(config_.run.out_dir) / "samples" / fmt::format("step-{:07d}.png", progress_.step)).string();
    const at::Tensor grid = write_sample_grid(path, samples, conditioning_.grid_columns, sample_video_fps(config_));
    if (tensorboard_) tensorboard_->add_image("samples", grid, progress_.step);
    spdlog::info("samples {} ({} images, {} {} steps, cfg {}) in {:.1f} s", path, config_.sample.num,
                 name_of(config_.sample.sampler), config_.sample.steps, config_.sample.cfg_scale, seconds_since(t0));
  }
  barrier();
}

void Trainer::evaluate() {
  check_health("before evaluation");
  ProfileRange range("eval");
  health_->record_event(progress_.step, "eval");
  const auto t0 = Clock::now();
  at::Tensor samples;
  state_->with_sampling_model([&](const models::VelocityFn& velocity) {
    samples = sample_rows_on_all_ranks(config_.eval.num, [&](int64_t first, int64_t count) {
      return generate_eval_samples(velocity, state_->model(), conditioning_.of_eval_rows, config_, device_, first,
                                   count);
    });
  });
  if (lead()) {
    const EvalScores scores = evaluator_->score(samples, state_->model(), config_, device_);
    metrics_->write(progress_.step, scores.metrics);
    if (tensorboard_) tensorboard_->add_scalars(scores.metrics, progress_.step);
    spdlog::info("eval at step {} ({} {}, {} weights): {} | {:.1f} s", progress_.step, scores.num, scores.unit,
                 state_->has_ema() ? "EMA" : "raw", scores.summary, seconds_since(t0));
  }
  barrier();
}

void Trainer::log_step(const StepResult& r, double step_time, double data_wait, double encode,
                       std::map<std::string, double> health) {
  const int64_t step = progress_.step, total = config_.train.steps;
  const float loss = r.loss.item<float>();  // host sync only on log steps
  const float grad_norm = r.grad_norm.item<float>();
  const double samples_per_s = config_.data.batch_size / step_time;
  spdlog::info("step {:>{}}/{} | loss {:.4f} | grad_norm {:.3f} | lr {:.2e} | {:.1f} samples/s | "
               "{:.3f} s/step (data {:.0f}%{}) | ETA {}",
               step, std::to_string(total).size(), total, loss, grad_norm, progress_.lr, samples_per_s, step_time,
               100.0 * data_wait / step_time,
               online_ ? fmt::format(", frozen encoders {:.0f}%", 100.0 * encode / step_time) : std::string(),
               format_duration((total - step) * step_time));
  std::map<std::string, double> values = {{"loss", loss},
                                                {"grad_norm", grad_norm},
                                                {"lr", progress_.lr},
                                                {"samples_per_s", samples_per_s},
                                                {"step_time_s", step_time},
                                                {"data_wait_s", data_wait},
                                                {"compute_s", step_time - data_wait - encode},
                                                {"encode_s", encode},
                                                {"epoch", double(progress_.loader.epoch)},
                                                {"samples_seen", double(progress_.samples_seen)},
                                                {"health_skipped_updates", double(health_->skipped_updates())},
                                                {"health_rollbacks", double(rollbacks_)}};
  values.merge(health);
  if (config_.data.source == DataSource::shards) {  // damaged samples skipped so far, over all ranks
    const auto [skipped, repeated] = data_->skipped_and_repeated(progress_.loader);
    values["data_skipped"] = double(skipped);
    values["data_repeated"] = double(repeated);
  }
  if (metrics_) metrics_->write(step, values);
  if (tensorboard_) tensorboard_->add_scalars(values, step);
  check_health("at log step");
}

int64_t Trainer::run() {
  const int64_t total = config_.train.steps;
  if (progress_.step >= total) {
    spdlog::info("nothing to do: step {} >= train.steps {}", progress_.step, total);
    return progress_.step;
  }
  install_stop_signal_handlers();
  state_->model().train();
  checkpoints_->reserve_staging([this] { return checkpoint_tensors(); });
  spdlog::info("training steps {} → {}", progress_.step, total);

  // Time of the training steps since the last log line; periodic eval / samples / checkpoints
  // are not counted, so samples/s and ETA describe training itself.
  double window_time = 0;
  int64_t window_steps = 0;
  double window_data_wait = 0, window_comm_wait = 0, window_encode = 0;
  while (progress_.step < total) {
    checkpoints_->poll();  // before the step: a failure joins this step's stop vote
    const auto step_start = Clock::now();
    if (profiler_) profiler_->step_begin(progress_.step + 1);
    StepResult r = train_step();
    if (profiler_) profiler_->step_end(progress_.step);
    if (r.action == HealthAction::Rollback) {
      rollback("see the health: line above");
      window_time = 0;
      window_steps = 0;
      window_data_wait = window_comm_wait = window_encode = 0;
      continue;
    }
    if (hooks_.on_step) {
      const double loss = r.loss.item<double>();  // synchronises the device: the time is real
      hooks_.on_step({progress_.step, seconds_since(step_start), r.data_wait_s, r.encode_s, loss});
    }
    const int64_t step = progress_.step;
    const bool last = step == total;
    const bool log_now = step % config_.train.log_every == 0 || step == 1 || last;
    if (log_now) r.loss.item<float>();  // wait for the device, so the window's time is real
    window_time += seconds_since(step_start);
    ++window_steps;
    window_data_wait += r.data_wait_s;
    window_comm_wait += r.comm_wait_s;
    window_encode += r.encode_s;

    if (log_now) {
      const double n = double(window_steps);
      const auto t_health = Clock::now();
      std::map<std::string, double> health =
          health_->on_interval({step - window_steps, step, window_time / n, window_data_wait / n, window_comm_wait / n});
      health_seconds_ += seconds_since(t_health);
      train_seconds_ += window_time;
      health["health_s_per_step"] = health_seconds_ / double(std::max<int64_t>(1, health_steps_ + window_steps));
      health_steps_ += window_steps;
      log_step(r, window_time / n, window_data_wait / n, window_encode / n, std::move(health));
      window_time = 0;
      window_steps = 0;
      window_data_wait = window_comm_wait = window_encode = 0;
    }
    if (config_.eval.every > 0 && (step % config_.eval.every == 0 || last)) evaluate();
    if (config_.sample.every > 0 && (step % config_.sample.every == 0 || last)) write_samples();
    if (checkpoints_->due(step, last)) write_checkpoint();
    // Under FSDP every rank must stop at the same step: the vote travelled with the step's
    // all-reduce (reduce_and_clip), so all ranks read the same answer here.
    const bool stop = runtime_ ? r.stop.item<float>() > 0 : stop_signal() != 0 || checkpoints_->stop_requested();
    if (stop) {
      checkpoints_->finish();  // a failed save (on any rank) ends the run here, with its error
      spdlog::warn("received signal {}: checkpointing at step {} and stopping", runtime_ ? "(on some rank)" : std::to_string(stop_signal()), step);
      if (!checkpoints_->saved(step)) write_checkpoint();
      checkpoints_->finish();  // exit only once the checkpoint is committed
      checkpoints_->require_saved(step, "the stop checkpoint");
      spdlog::warn("stopped at step {}; the same command resumes from {}/checkpoints/{} (checkpoint.resume: auto)",
                   step, config_.run.out_dir, checkpoint_name(step));
      return step;
    }
  }
  checkpoints_->finish();  // the final checkpoint may still be persisting
  if (hooks_.final_checkpoint) checkpoints_->require_saved(progress_.step, "the final checkpoint");
  spdlog::info("done: {} steps, {} samples seen", progress_.step, progress_.samples_seen);
  if (health_steps_ > 0)
    spdlog::info("health checks: {:.2f} ms per step, {:.2f}% of the training step time (host time in the checks: "
                 "per-sample losses, flags, verdicts, the log intervals' gathers)",
                 1e3 * health_seconds_ / double(health_steps_), 100 * health_seconds_ / train_seconds_);
  write_rank_report();
  return progress_.step;
}

}  // namespace flowtrain::trainer
