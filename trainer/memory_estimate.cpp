#include "trainer/memory_estimate.h"

#include "models/autoencoder/autoencoder.h"
#include "models/clip/clip.h"
#include "models/t5/t5.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/fsdp.h"
#include "trainer/family.h"
#include "trainer/frozen/frozen_models.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace flowtrain::trainer {

namespace fs = std::filesystem;

namespace {

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", bytes / double(1 << 30)); }

// The frozen encoders' parameters, read from their files' headers and config.json; nullopt when
// a named file is not there (a plan written away from the weights).
std::optional<int64_t> frozen_parameters(const ModelConfig& m) {
  int64_t n = 0;
  try {
    if (!m.autoencoder.empty()) {
      if (!fs::exists(m.autoencoder)) return std::nullopt;
      n += models::autoencoder_parameter_count(autoencoder_options_of_file(m.autoencoder));
    }
    if (!m.t5_encoder.empty()) {
      const fs::path config = fs::path(m.t5_encoder) / "config.json";
      if (!fs::exists(config)) return std::nullopt;
      n += models::t5_encoder_parameter_count(t5_options_of_config(config.string()));
    }
    if (!m.clip_encoder.empty()) {
      const fs::path config = fs::path(m.clip_encoder) / "config.json";
      if (!fs::exists(config)) return std::nullopt;
      n += models::clip_text_parameter_count(clip_options_of_config(config.string()));
    }
  } catch (const std::exception&) {
    return std::nullopt;  // a broken file is the run's error to report, with its name
  }
  return n;
}

// Elements unit `u` keeps through the forward under the run's activation checkpointing, and what
// its backward brings back when it recomputes.
struct Kept {
  double forward = 0, recomputed = 0;
};
Kept kept_by(const models::UnitFootprint& u, bool is_block, int64_t block_index, const TrainConfig& train) {
  using parallel::RecomputePolicy;
  const RecomputePolicy policy = train.activation_checkpointing;
  const int64_t every = train.activation_checkpointing_every;
  if (!is_block || policy == RecomputePolicy::none) return {u.saved, 0};
  if (policy == RecomputePolicy::full)
    return parallel::checkpoint_block(policy, every, block_index) ? Kept{u.input, u.saved - u.input} : Kept{u.saved, 0};
  const models::Sublayer part = policy == RecomputePolicy::attention ? models::Sublayer::Attention : models::Sublayer::Mlp;
  const double dropped = policy == RecomputePolicy::attention ? u.attention : u.mlp;
  if (parallel::checkpoint_sublayer(policy, every, block_index, part)) return {u.saved - dropped, dropped};
  return {u.saved, 0};
}

}  // namespace

MemoryEstimate estimate_memory(const Config& config, const ResolvedRun& run, int64_t dataset_bytes) {
  MemoryEstimate e;
  const FamilySpec& family = model_family(config.model.arch);
  if (!family.footprint) {
    e.unavailable_reason = fmt::format("model.arch {} states no per-unit footprint", config.model.arch);
    return e;
  }
  const bool cuda = run.device == c10::kCUDA;
  const bool bf16 = config.train.bf16_autocast();
  const std::vector<models::UnitFootprint> units = family.footprint(config.model, !cuda && !bf16);
  e.available = true;
  e.cuda = cuda;

  const bool sharded = run.sharded;
  const int64_t shards = sharded ? run.mesh.dp_shard * run.mesh.cp : 1;
  const int64_t compute_bytes = bf16 ? 2 : 4;  // FSDP's gathered weights, activations
  const int64_t reduce_bytes = config.parallel.reduce_dtype == Precision::bf16 ? 2 : 4;
  auto shard_of = [&](int64_t n) { return (n + shards - 1) / shards; };  // padded to N equal shards
  // Per rank: the micro-batch's samples, each holding 1/cp of the tokens under context parallelism.
  const double samples = double(run.micro_batch) / double(sharded ? run.mesh.cp : 1);

  int64_t master = 0, largest_unit = 0, fixed = 0;
  for (const auto& u : units) {
    fixed += u.fixed * 4;
    master += shard_of(u.parameters) * 4;
    largest_unit = std::max(largest_unit, shards * shard_of(u.parameters));
  }
  e.weights = master;
  e.optimizer = 2 * master;
  e.ema = config.train.ema_decay > 0 ? master : 0;
  e.gradients = master;
  if (const auto n = frozen_parameters(config.model)) {
    e.frozen = *n * (cuda ? 2 : 4);  // bf16 on CUDA, fp32 on the CPU (trainer/frozen)
  } else {
    e.frozen_counted = false;
  }
  const int64_t staging = config.checkpoint.async && config.checkpoint.every > 0 ? e.weights + e.optimizer + e.ema : 0;
  (cuda ? e.host_staging : e.staging) = staging;
  if (sharded && !cuda) {
    // parallel/fsdp.h on the CPU: released gathers are kept by size (as many of a size as were
    // ever gathered together: two blocks of a kind with prefetch, one stem, one head) and
    // kMaxReducesInFlight reduce slots of the largest unit.
    std::map<int64_t, int64_t> of_size;
    for (const auto& u : units) of_size[shards * shard_of(u.parameters)] += 1;
    for (const auto& [numel, count] : of_size) e.fsdp_buffers += std::min<int64_t>(count, 2) * numel * compute_bytes;
    e.fsdp_buffers += int64_t(parallel::FullyShardedModule::kMaxReducesInFlight) * largest_unit * reduce_bytes;
  }
  e.dataset = config.data.source == DataSource::shards ? 0 : dataset_bytes;
  const int64_t dataset_on_device = cuda ? 0 : std::max<int64_t>(0, e.dataset);
  const int64_t persistent = fixed + e.weights + e.optimizer + e.ema + e.frozen + e.fsdp_buffers + e.staging + dataset_on_device;

  // Forward: what each unit keeps, in bytes for this rank's micro-batch.
  const size_t count = units.size();
  std::vector<double> kept(count), recomputed(count);
  for (size_t i = 0; i < count; ++i) {
    const bool is_block = i > 0 && i + 1 < count;  // stem first, head last
    const Kept k = kept_by(units[i], is_block, int64_t(i) - 1, config.train);
    kept[i] = k.forward * samples * compute_bytes;
    recomputed[i] = k.recomputed * samples * compute_bytes;
  }
  double activations = 0;
  for (double k : kept) activations += k;
  e.activations = int64_t(activations);

  // Backward, unit by unit from the head; `below` is what the units not yet reached still keep.
  // Under FSDP with gradient accumulation that reduces once a step, every unit's unsharded
  // gradients outlive its backward until the step's last micro-batch (parallel/fsdp.h).
  const bool accumulates_unsharded =
      sharded && config.train.grad_accum > 1 && !config.parallel.reduce_every_micro_batch;
  double accumulated = 0;  // from the second micro-batch on: every unit's
  if (accumulates_unsharded)
    for (const auto& u : units) accumulated += double(u.parameters) * compute_bytes;
  // On one process, accumulated gradients (.grad, fp32) are all there from the second micro-batch.
  const bool accumulates_whole = !sharded && config.train.grad_accum > 1;
  double peak = 0, below = activations, grads_done = accumulates_whole ? double(master) : 0;
  std::string peak_at;
  for (size_t j = count; j-- > 0;) {
    below -= kept[j];
    const double unit = double(units[j].parameters);
    double transient = kept[j] + recomputed[j] + units[j].backward_working * samples * compute_bytes;
    if (sharded) {
      const double neighbour = j > 0 ? double(units[j - 1].parameters) : 0;
      if (cuda) transient += (unit + neighbour) * compute_bytes + 2 * unit * reduce_bytes;  // gathers, reduces
      grads_done += double(shard_of(units[j].parameters)) * 4;
      if (!accumulates_unsharded) transient += unit * compute_bytes;  // the unit's unsharded gradients
    } else {
      if (!accumulates_whole) grads_done += unit * 4;
      if (bf16) transient += unit * 2;  // autocast's bf16 copy of the unit's weights
    }
    const double live = below + transient + grads_done + accumulated;
    if (live > peak) {
      peak = live;
      peak_at = "backward of " + units[j].name;
    }
  }
  if (double(e.gradients) > peak) {
    peak = double(e.gradients);
    peak_at = "optimizer step";
  }
  e.peak = persistent + int64_t(peak);
  e.peak_at = peak_at;
  return e;
}

std::vector<std::pair<std::string, std::string>> MemoryEstimate::lines() const {
  if (!available) return {{"memory", "not estimated: " + unavailable_reason}};
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("memory", fmt::format("{} a rank at the step's peak ({}), estimated", gib(peak), peak_at));
  out.emplace_back("", fmt::format("weights {} + AdamW {}{} + gradients {} (fp32, this rank's)", gib(weights),
                                   gib(optimizer), ema > 0 ? " + EMA " + gib(ema) : "", gib(gradients)));
  out.emplace_back("", fmt::format("activations {} at the end of the forward", gib(activations)));
  if (frozen > 0) out.emplace_back("", fmt::format("frozen encoders {}", gib(frozen)));
  if (!frozen_counted) out.emplace_back("", "frozen encoders not counted: their files are not here");
  if (fsdp_buffers > 0) out.emplace_back("", fmt::format("FSDP buffers kept for reuse {}", gib(fsdp_buffers)));
  if (staging > 0) out.emplace_back("", fmt::format("checkpoint staging {}", gib(staging)));
  if (dataset > 0)
    out.emplace_back("", fmt::format("{}data set in memory {}", cuda ? "+ host memory: " : "", gib(dataset)));
  if (dataset < 0)
    out.emplace_back("", fmt::format("{}data set in memory not counted (data.source holds it whole: add its size)",
                                     cuda ? "+ host memory: " : ""));
  if (host_staging > 0) out.emplace_back("", fmt::format("+ host memory: checkpoint staging {}", gib(host_staging)));
  return out;
}

}  // namespace flowtrain::trainer
