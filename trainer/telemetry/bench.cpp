#include "trainer/telemetry/bench.h"
#include "trainer/telemetry/profiler.h"

#include "trainer/first_micro_batch.h"

#include "trainer/data_source.h"

#include "data/loader.h"
#include "data/safetensors.h"
#include "models/flow_matching.h"
#include "parallel/env.h"
#include "trainer/builders.h"
#include "trainer/family.h"
#include "trainer/memory_estimate.h"
#include "trainer/config/resolve.h"
#include "trainer/telemetry/memory_stats.h"
#include "trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace fs = std::filesystem;

namespace flowtrain::trainer {

namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

}  // namespace

double measure_matmul_tflops(const c10::Device& device, at::ScalarType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 2048;
  auto opts = at::TensorOptions().device(device).dtype(dtype);
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
  for (int i = 0; i < 2; ++i) at::mm(a, b);  // warm up
  synchronize_device(device);
  int64_t reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < 1.0 || reps < 3) {
    at::mm(a, b);
    ++reps;
    synchronize_device(device);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return 2.0 * double(n) * n * n * reps / elapsed / 1e12;
}

namespace {

// The checkpoint rows of a run's metrics.jsonl (rank 0 writes them as saves finish).
std::vector<nlohmann::json> checkpoint_rows(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("checkpoint_blocked_s")) rows.push_back(std::move(row));
  }
  return rows;
}

double median_of(const std::vector<nlohmann::json>& rows, const char* key) {
  std::vector<double> v;
  for (const auto& row : rows) v.push_back(row.at(key).get<double>());
  return quantile(v, 0.5);
}

int64_t directory_bytes(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
  return total;
}

// The async run's saves against its step times: a step overlapped a save when it started before
// the save's background persist ended (step times after the save, summed, < persist time).
void measure_overlap(CheckpointCost& cost, const std::vector<nlohmann::json>& saves,
                     const std::map<int64_t, double>& step_times, int64_t first_timed_step) {
  std::set<int64_t> overlapped;
  for (const auto& save : saves) {
    const int64_t step = save.at("step").get<int64_t>();
    const double persist = save.at("checkpoint_persist_s").get<double>();
    double elapsed = 0;
    for (auto it = step_times.upper_bound(step); it != step_times.end() && elapsed < persist; ++it) {
      overlapped.insert(it->first);
      elapsed += it->second;
    }
  }
  std::vector<double> clear, overlap;
  for (const auto& [step, time] : step_times) {
    if (step < first_timed_step) continue;
    (overlapped.count(step) ? overlap : clear).push_back(time);
  }
  cost.step_clear_s = quantile(clear, 0.5);
  cost.step_overlap_s = quantile(overlap, 0.5);
  cost.overlap_steps = static_cast<int64_t>(overlap.size());
}

}  // namespace

BenchReport run_benchmark(Config config, const BenchOptions& o) {
  if (o.synthetic) config.data.source = DataSource::synthetic;
  // A throw-away run directory: a benchmark must never touch a real run's checkpoints.
  const fs::path base = fs::temp_directory_path() / fmt::format("flowtrain-bench-{}", ::getpid());
  fs::remove_all(base);
  const fs::path dir = o.checkpoint ? base / "async" : base;
  config.run.out_dir = dir.string();
  config.train.steps = o.warmup + o.steps;
  config.train.log_every = std::max<int64_t>(1, config.train.steps);
  config.train.tensorboard = false;
  config.sample.every = 0;
  config.eval.every = 0;
  config.checkpoint.every = 0;
  config.checkpoint.resume = "never";
  BenchReport r;
  if (o.checkpoint) {
    if (parallel::resolve_dist_env_from_process().world > 1)
      throw ConfigError("bench --checkpoint runs one process (two trainers in a row): run it without launch/srun");
    CheckpointCost cost;
    cost.every = o.checkpoint_every > 0 ? o.checkpoint_every : std::max<int64_t>(1, o.steps / 3);
    config.checkpoint.every = cost.every;
    config.checkpoint.keep = 1;
    // The synchronous reference first, in a trainer of its own with the same seed and steps.
    Config sync = config;
    sync.run.out_dir = (base / "sync").string();
    sync.checkpoint.async = false;
    sync.validate();
    {
      TrainerHooks quiet;
      quiet.final_checkpoint = false;
      Trainer reference(sync, quiet);
      reference.run();
    }
    const auto sync_saves = checkpoint_rows(base / "sync");
    cost.sync_s = median_of(sync_saves, "checkpoint_blocked_s");
    config.checkpoint.async = true;
    r.checkpoint = cost;
  }
  config.validate();

  std::vector<double> step_times, data_waits, encodes;
  std::map<int64_t, double> all_step_times;  // every step, warm-up included (saves may follow any)
  TrainerHooks hooks;
  hooks.final_checkpoint = false;
  hooks.on_step = [&](const StepStats& s) {
    if (s.step == 1) r.first_loss = s.loss;
    all_step_times[s.step] = s.step_time_s;
    if (s.step > o.warmup) {
      step_times.push_back(s.step_time_s);
      data_waits.push_back(s.data_wait_s);
      encodes.push_back(s.encode_s);
    }
  };
  Trainer trainer(config, hooks);
  const c10::Device device = trainer.device();
  trainer.run();
  if (r.checkpoint) {
    CheckpointCost& cost = *r.checkpoint;
    const auto saves = checkpoint_rows(dir);
    cost.saves = static_cast<int64_t>(saves.size());
    cost.blocked_s = median_of(saves, "checkpoint_blocked_s");
    cost.persist_s = median_of(saves, "checkpoint_persist_s");
    measure_overlap(cost, saves, all_step_times, o.warmup + 1);
    cost.staging_bytes = trainer.checkpoint_staging_bytes();
    for (const auto& e : fs::directory_iterator(dir / "checkpoints"))
      if (e.is_directory()) cost.bytes = directory_bytes(e.path());  // keep = 1: the newest save
  }

  r.device = device.str();
  r.precision = name_of(config.train.precision);
  if (config.fp8.recipe != models::fp8::Recipe::none)
    r.precision += " + fp8 " + name_of(config.fp8.recipe) + (config.fp8.emulate || !device.is_cuda() ? " (emulated)" : "");
  r.threads = at::get_num_threads();
  r.rank = trainer.rank();
  r.world = trainer.world();
  r.batch = config.data.batch_size;
  r.tokens_per_sample = trainer.model().tokens_per_sample();
  r.steps = o.steps;
  r.warmup = o.warmup;
  r.params_m = models::count_parameters(trainer.model()) / 1e6;
  r.train_gflop_per_sample = trainer.model().train_flops_per_sample() / 1e9;
  r.step_time_median_s = quantile(step_times, 0.5);
  r.step_time_p10_s = quantile(step_times, 0.1);
  r.step_time_p90_s = quantile(step_times, 0.9);
  r.step_time_min_s = quantile(step_times, 0.0);
  r.step_time_max_s = quantile(step_times, 1.0);
  r.data_wait_median_s = quantile(data_waits, 0.5);
  r.encode_median_s = quantile(encodes, 0.5);
  r.samples_per_s = double(r.batch) / r.step_time_median_s;
  r.tokens_per_s = r.samples_per_s * double(r.tokens_per_sample);
  r.achieved_tflops = r.samples_per_s * r.train_gflop_per_sample / 1e3;
  const MemoryPeaks peaks = memory_peaks(device);
  r.peak_rss_bytes = peaks.rss_bytes;
  r.peak_allocated_bytes = peaks.allocated_bytes;
  r.allocated_kind = peaks.allocated_kind;
  r.peak_memory_bytes = device.is_cuda() ? peaks.allocated_bytes : peaks.rss_bytes;
  r.memory_kind = device.is_cuda() ? "cuda peak allocated" : "cpu peak RSS";
  // The data set the run holds in memory: on the CPU it is part of the measured peak.
  const MemoryEstimate estimate = estimate_memory(
      config, resolve(config, this_environment(parallel::resolve_dist_env_from_process())), trainer.dataset_bytes());
  if (estimate.available) r.estimated_peak_bytes = estimate.peak;
  if (r.world > 1) {
    r.peak_memory_bytes_per_rank = trainer.gather_from_ranks(r.peak_memory_bytes);
    r.peak_allocated_bytes_per_rank = trainer.gather_from_ranks(r.peak_allocated_bytes);
  }
  if (o.peak_tflops > 0) {
    r.peak_tflops = o.peak_tflops * double(r.world);  // given per rank (per GPU)
    r.peak_source = r.world > 1 ? fmt::format("given × {} ranks", r.world) : "given";
  } else {
    const at::ScalarType dtype = config.train.bf16_autocast() ? at::kBFloat16 : at::kFloat;
    // Every rank measures its own share (ranks sharing a machine measure at the same time, so
    // each gets its share of the cores); the job's peak is the sum, taken as world × this one.
    r.peak_tflops = measure_matmul_tflops(device, dtype) * double(r.world);
    r.peak_source = fmt::format("measured {} matmul{}", dtype == at::kBFloat16 ? "bf16" : "fp32",
                                r.world > 1 ? fmt::format(" × {} ranks", r.world) : "");
  }
  r.mfu = r.achieved_tflops / r.peak_tflops;
  fs::remove_all(base);
  return r;
}

std::string BenchReport::to_json() const {
  nlohmann::json j = {{"device", device},
                      {"precision", precision},
                      {"threads", threads},
                      {"batch", batch},
                      {"tokens_per_sample", tokens_per_sample},
                      {"steps", steps},
                      {"warmup", warmup},
                      {"params_m", params_m},
                      {"train_gflop_per_sample", train_gflop_per_sample},
                      {"step_time_median_s", step_time_median_s},
                      {"step_time_p10_s", step_time_p10_s},
                      {"step_time_p90_s", step_time_p90_s},
                      {"step_time_min_s", step_time_min_s},
                      {"step_time_max_s", step_time_max_s},
                      {"data_wait_median_s", data_wait_median_s},
                      {"encode_median_s", encode_median_s},
                      {"samples_per_s", samples_per_s},
                      {"tokens_per_s", tokens_per_s},
                      {"achieved_tflops", achieved_tflops},
                      {"peak_tflops", peak_tflops},
                      {"peak_source", peak_source},
                      {"mfu", mfu},
                      {"rank", rank},
                      {"world", world},
                      {"peak_memory_bytes", peak_memory_bytes},
                      {"memory_kind", memory_kind},
                      {"peak_rss_bytes", peak_rss_bytes},
                      {"peak_allocated_bytes", peak_allocated_bytes},
                      {"allocated_kind", allocated_kind},
                      {"estimated_peak_bytes", estimated_peak_bytes},
                      {"first_loss", first_loss}};
  if (!peak_memory_bytes_per_rank.empty()) {
    j["peak_memory_bytes_per_rank"] = peak_memory_bytes_per_rank;
    j["peak_allocated_bytes_per_rank"] = peak_allocated_bytes_per_rank;
  }
  if (checkpoint) {
    const CheckpointCost& c = *checkpoint;
    j["checkpoint_sync_s"] = c.sync_s;
    j["checkpoint_blocked_s"] = c.blocked_s;
    j["checkpoint_persist_s"] = c.persist_s;
    j["checkpoint_blocked_fraction"] = c.sync_s > 0 ? c.blocked_s / c.sync_s : 0.0;
    j["checkpoint_saves"] = c.saves;
    j["checkpoint_every"] = c.every;
    j["checkpoint_bytes"] = c.bytes;
    j["checkpoint_staging_bytes"] = c.staging_bytes;
    j["checkpoint_step_clear_s"] = c.step_clear_s;
    j["checkpoint_step_overlap_s"] = c.step_overlap_s;
    j["checkpoint_overlap_steps"] = c.overlap_steps;
  }
  return j.dump(2);
}

std::string BenchReport::to_table() const {
  std::string per_rank;
  if (!peak_memory_bytes_per_rank.empty()) {
    per_rank = "\npeak per rank, MiB (" + memory_kind + " / " + allocated_kind + "):";
    for (size_t i = 0; i < peak_memory_bytes_per_rank.size(); ++i)
      per_rank += fmt::format(" rank {} {:.1f} / {:.1f}", i, peak_memory_bytes_per_rank[i] / 1048576.0,
                              peak_allocated_bytes_per_rank[i] / 1048576.0);
  }
  std::string saves;
  if (checkpoint) {
    const CheckpointCost& c = *checkpoint;
    saves = fmt::format(
        "\ncheckpoint ({:.1f} MiB every {} steps, {} saves): sync save blocks {:.3f} s | async blocks {:.3f} s "
        "({:.1f}% of sync), persists {:.3f} s in the background | step {:.4f} s clear, {:.4f} s over {} steps "
        "overlapping a persist | staging {:.1f} MiB",
        c.bytes / 1048576.0, c.every, c.saves, c.sync_s, c.blocked_s, c.sync_s > 0 ? 100 * c.blocked_s / c.sync_s : 0.0,
        c.persist_s, c.step_clear_s, c.step_overlap_s, c.overlap_steps, c.staging_bytes / 1048576.0);
  }
  return (per_rank.empty() ? table_lines() : table_lines() + per_rank) + saves;
}

std::string BenchReport::table_lines() const {
  return fmt::format(
      "device {} ({}, {} threads) | batch {} × {} tokens | {:.2f}M params, {:.3f} GFLOP/sample\n"
      "step time median {:.4f} s (p10 {:.4f}, p90 {:.4f}, min {:.4f}, max {:.4f}) over {} steps after {} warm-up\n"
      "{:.1f} samples/s | {:.0f} tokens/s | {:.3f} TFLOP/s achieved | peak {:.3f} TFLOP/s ({}) | MFU {:.1f}%\n"
      "{} {:.1f} MiB{} | {} peak {:.1f} MiB{} | data wait median {:.4f} s{} | first-step loss {:.6f}",
      device, precision, threads, batch, tokens_per_sample, params_m, train_gflop_per_sample, step_time_median_s,
      step_time_p10_s, step_time_p90_s, step_time_min_s, step_time_max_s, steps, warmup, samples_per_s, tokens_per_s,
      achieved_tflops, peak_tflops, peak_source, 100 * mfu, memory_kind, peak_memory_bytes / 1048576.0,
      world > 1 ? fmt::format(" (rank {} of {})", rank, world) : "", allocated_kind, peak_allocated_bytes / 1048576.0,
      estimated_peak_bytes > 0
          ? fmt::format(" (estimated {:.1f} MiB, {:+.1f}%)", estimated_peak_bytes / 1048576.0,
                        100.0 * (double(estimated_peak_bytes) / double(peak_allocated_bytes) - 1.0))
          : std::string(),
      data_wait_median_s,
      // The frozen encoders' FLOPs are not in GFLOP/sample or MFU: those count the trained model.
      encode_median_s > 0 ? fmt::format(" | frozen encoders median {:.4f} s (in the step time, not in MFU)", encode_median_s)
                          : std::string(),
      first_loss);
}

double write_parity_dump(const Config& c, const std::string& path) {
  // Exactly the trainer's first micro-batch: same initialisation seed, same first batch of the
  // loader, same per-step generator (trainer.cpp: Trainer::train_step).
  const FamilySpec& family = model_family(c.model.arch);
  if (!family.reference_metadata)
    throw ConfigError(fmt::format("--parity-dump: bench/pytorch_peer.py has no peer of model.arch {} (it has: {})",
                                  c.model.arch,
                                  fmt::join(arch_names_where([](const FamilySpec& f) { return bool(f.reference_metadata); }),
                                            "|")));
  // The family's architecture entries first: they refuse what the peer cannot build.
  const std::map<std::string, std::string> architecture = family.reference_metadata(c.model);
  at::manual_seed(static_cast<uint64_t>(c.run.seed));
  const std::shared_ptr<models::DiffusionModel> model = family.build(c.model);
  const FirstMicroBatch first = first_micro_batch(c, *model);
  const at::Tensor& x0 = first.x0;
  const models::FlowMatchingDraw& draw = first.draw;
  models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& cond) {
    return model->forward(x, t, cond);
  };
  at::Tensor loss;
  {
    at::NoGradGuard no_grad;
    loss = models::flow_matching_loss(velocity, x0, draw).loss;
  }
  data::NamedTensors out;
  for (const auto& p : model->named_parameters()) out.emplace_back("model." + p.key(), p.value().detach());
  out.emplace_back("x0", x0);
  for (const auto& [name, tensor] : draw.cond.tensors()) out.emplace_back(name, tensor);  // after CFG dropout
  out.emplace_back("t", draw.t);
  out.emplace_back("noise", draw.noise);
  out.emplace_back("loss", loss);
  std::map<std::string, std::string> meta = {
      {"arch", c.model.arch},
      {"patch", std::to_string(c.model.patch)},
      {"input_size", std::to_string(c.model.image_size)},
      {"in_channels", std::to_string(c.model.in_channels)},
      {"hidden", std::to_string(c.model.resolved_hidden())},
      {"depth", std::to_string(c.model.resolved_depth())},
      {"heads", std::to_string(c.model.resolved_heads())},
      {"mlp_ratio", fmt::format("{}", c.model.mlp_ratio)},
      {"batch_size", std::to_string(c.data.batch_size)},
      {"grad_accum", std::to_string(c.train.grad_accum)},
      {"lr", fmt::format("{}", c.optim.lr)},
      {"threads", std::to_string(at::get_num_threads())},
      // What the step does, so the peer does the same work or refuses.
      {"precision", name_of(c.train.precision)},
      {"grad_clip", fmt::format("{}", c.optim.grad_clip)},
      {"ema_decay", fmt::format("{}", c.train.ema_decay)},
      {"ema_warmup", c.train.ema_warmup ? "true" : "false"},
      {"beta1", fmt::format("{}", c.optim.beta1)},
      {"beta2", fmt::format("{}", c.optim.beta2)},
      {"eps", fmt::format("{}", c.optim.eps)},
      {"weight_decay", fmt::format("{}", c.optim.weight_decay)},
      {"timesteps", name_of(c.flow.timesteps)},
      {"logit_mean", fmt::format("{}", c.flow.logit_mean)},
      {"logit_std", fmt::format("{}", c.flow.logit_std)},
      {"shift", fmt::format("{}", time_shift(c))},
      {"activation_checkpointing", name_of(c.train.activation_checkpointing)},
      {"tf32", c.train.tf32 ? "true" : "false"}};
  meta.insert(architecture.begin(), architecture.end());
  data::write_safetensors(path, out, meta);
  return loss.item<double>();
}

}  // namespace flowtrain::trainer
