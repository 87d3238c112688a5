// Config loading: one schema table drives parsing, validation, to_yaml and all_keys, so a new
// key is added in exactly one place (build_schema below) and can never be parsed but not
// emitted, or emitted but not validated.
#include "trainer/config/config.h"
#include "trainer/config/resolve.h"
#include "trainer/config/schema.h"

#include "models/fp8/recipe.h"
#include "trainer/health/batch_ordinals.h"
#include "trainer/health/checkpoint_pause.h"

#include "trainer/family.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>
#include <variant>

// fmt is deliberately not used here: the LibTorch wheel ships its own (newer) fmt headers that
// shadow the system library's on the include path, and this file does not need either.

namespace flowtrain::trainer {

// The words of each enum key, in enumerator order (config.h).
#define FLOWTRAIN_ENUM_WORDS(E, ...)                               \
  template <>                                                      \
  const std::vector<std::string>& enum_words<E>() {                \
    static const std::vector<std::string> words = {__VA_ARGS__};   \
    return words;                                                  \
  }
FLOWTRAIN_ENUM_WORDS(DeviceChoice, "auto", "cpu", "cuda")
FLOWTRAIN_ENUM_WORDS(DataSource, "fashion_mnist", "compositions", "synthetic", "shards")
FLOWTRAIN_ENUM_WORDS(ImageMember, "image", "latent")
FLOWTRAIN_ENUM_WORDS(TextMember, "embeddings", "caption")
FLOWTRAIN_ENUM_WORDS(DamagePolicy, "skip", "fail")
FLOWTRAIN_ENUM_WORDS(ScheduleKind, "constant", "cosine")
FLOWTRAIN_ENUM_WORDS(Precision, "fp32", "bf16")
FLOWTRAIN_ENUM_WORDS(SaveFailurePolicy, "stop", "warn")
FLOWTRAIN_ENUM_WORDS(CpAttentionChoice, "auto", "ulysses", "ring", "hybrid")
FLOWTRAIN_ENUM_WORDS(FsdpChoice, "auto", "on")
FLOWTRAIN_ENUM_WORDS(BackendChoice, "auto", "nccl", "gloo")
FLOWTRAIN_ENUM_WORDS(NonfinitePolicy, "stop", "skip", "rollback")
FLOWTRAIN_ENUM_WORDS(SpikePolicy, "off", "warn", "skip", "rollback")
FLOWTRAIN_ENUM_WORDS(models::TimestepDistribution, "uniform", "logit_normal")
FLOWTRAIN_ENUM_WORDS(models::SamplerKind, "euler", "heun")
FLOWTRAIN_ENUM_WORDS(models::fp8::AmaxReduce, "max", "most_recent")
FLOWTRAIN_ENUM_WORDS(parallel::RecomputePolicy, "none", "full", "attention", "mlp")
FLOWTRAIN_ENUM_WORDS(parallel::ReductionFault, "none", "sum_over_shard_group", "no_context_sum", "sum_over_replicas")
#undef FLOWTRAIN_ENUM_WORDS
template <>
const std::vector<std::string>& enum_words<models::fp8::Recipe>() {
  static const std::vector<std::string> words = models::fp8::recipe_names();  // the recipe's own names
  return words;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Text helpers.

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}


// ---------------------------------------------------------------------------------------------
// Number formatting: shortest representation that parses back to the same double, so that
// to_yaml → parse is exact.

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  // A mantissa without a dot ("1", "1e-04") reads back here either way, but "1.0" tells a
  // human the key takes a real number, and YAML 1.1 readers (PyYAML) only take "1.0e-04" as a
  // float.
  if (std::isfinite(v) && s.find('.') == std::string::npos) {
    const auto e = s.find('e');
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  }
  return s;
}

std::string format_int(int64_t v) { return std::to_string(v); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Allowed values of a key (schema.h).

std::string Allowed::describe() const {
  if (choices_now) return "one of " + join(choices_now(), "|");
  if (!choices.empty()) return "one of " + join(choices, "|");
  if (non_empty) return "a non-empty string";
  auto num = [](double v) {
    // Bounds are whole numbers or simple fractions; print 0 rather than 0.0.
    if (v == std::floor(v) && std::fabs(v) < 1e15) return format_int(static_cast<int64_t>(v));
    return format_double(v);
  };
  if (lo && hi)
    return std::string("in ") + (lo_open ? "(" : "[") + num(*lo) + ", " + num(*hi) + (hi_open ? ")" : "]");
  if (lo) return std::string(lo_open ? "> " : ">= ") + num(*lo);
  if (hi) return std::string(hi_open ? "< " : "<= ") + num(*hi);
  return "";
}

bool Allowed::admits(double v) const {
  if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
  if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
  return true;
}

bool Allowed::admits(const std::string& v) const {
  if (non_empty && v.empty()) return false;
  if (choices_now) {
    const std::vector<std::string> now = choices_now();
    return std::find(now.begin(), now.end(), v) != now.end();
  }
  return choices.empty() || std::find(choices.begin(), choices.end(), v) != choices.end();
}

Allowed any_value() { return {}; }
Allowed at_least(double lo) {
  Allowed a;
  a.lo = lo;
  return a;
}
Allowed above(double lo) {
  Allowed a;
  a.lo = lo;
  a.lo_open = true;
  return a;
}
Allowed range(const char* brackets, double lo, double hi) {
  Allowed a;
  a.lo = lo;
  a.hi = hi;
  a.lo_open = brackets[0] == '(';
  a.hi_open = brackets[1] == ')';
  return a;
}
Allowed one_of_registered(std::function<std::vector<std::string>()> choices) {
  Allowed a;
  a.choices_now = std::move(choices);
  return a;
}
Allowed one_of(std::vector<std::string> choices) {
  Allowed a;
  a.choices = std::move(choices);
  return a;
}
Allowed non_empty() {
  Allowed a;
  a.non_empty = true;
  return a;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The schema.

// One visitor from several lambdas: the Ref kinds that are pointers, and EnumRef.
template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

// One key of the config with its section: the section's own, or a model family's.
struct Field {
  std::string section;
  Key<Config> key;

  const std::string& name() const { return key.name; }
  std::string dotted() const { return section + "." + key.name; }
  Ref at(Config& c) const { return key.at(c); }
  // Read-only access; the accessor is shared with the writers, so it takes a mutable Config.
  Ref at_const(const Config& c) const { return key.at(const_cast<Config&>(c)); }
};

// A section's own keys. The model section also has the keys of the family model.arch names
// (FamilySpec::keys): fields_of() below puts them together.
struct Section {
  std::string name;
  std::vector<Key<Config>> keys;

  const Key<Config>* find(const std::string& key) const {
    for (const auto& k : keys)
      if (k.name == key) return &k;
    return nullptr;
  }
};

// The keys of one section struct S of Config.
template <class S>
struct SectionBuilder {
  std::string name;
  KeyList<Config, S> list;

  template <class... A>
  SectionBuilder& add(A&&... a) {
    list.add(std::forward<A>(a)...);
    return *this;
  }
  Section section() const { return Section{name, list.keys}; }
};

template <class S>
SectionBuilder<S> section(const char* name, S Config::*member) {
  return SectionBuilder<S>{name, KeyList<Config, S>([member](Config& c) -> S& { return c.*member; })};
}

std::vector<Section> build_schema() {
  std::vector<Section> s;

  s.push_back(section("run", &Config::run)
                  .add("name", &RunConfig::name, non_empty(), "run name, shown in logs")
                  .add("out_dir", &RunConfig::out_dir, non_empty(), "checkpoints, samples and logs go here")
                  .add("seed", &RunConfig::seed, at_least(0), "seed for init, noise and data order")
                  .add("device", &RunConfig::device,
                       "auto = cuda when a GPU is present")
                  .section());

  // The keys every family has; each family adds its own (FamilySpec::keys, trainer/families/).
  s.push_back(section("model", &Config::model)
                  .add("arch", &ModelConfig::arch, one_of_registered(model_arch_names), "model family")
                  .add("size", &ModelConfig::size, one_of_registered(model_size_names), "preset for hidden/depth/heads")
                  .add("hidden", &ModelConfig::hidden, at_least(0), "width; 0 = from size")
                  .add("depth", &ModelConfig::depth, at_least(0), "transformer blocks (flux: double-stream); 0 = from size")
                  .add("heads", &ModelConfig::heads, at_least(0), "attention heads; 0 = from size")
                  .add("mlp_ratio", &ModelConfig::mlp_ratio, above(0), "MLP width / hidden")
                  .add("patch", &ModelConfig::patch, at_least(1), "patch side; must divide image_size")
                  .add("image_size", &ModelConfig::image_size, at_least(1), "input side (pixels or latent cells)")
                  .add("frames", &ModelConfig::frames, at_least(1),
                       "frames per sample; > 1 trains a video model on clips [C, T, H, W]")
                  .add("in_channels", &ModelConfig::in_channels, at_least(1), "input channels")
                  .add("autoencoder", &ModelConfig::autoencoder, any_value(),
                       "frozen autoencoder: ae.safetensors (FLUX.1's layout); the model then works in its latent space "
                       "(images encoded in the step, or by `flowtrain data encode`; samples decoded)")
                  .add("text_encoders.t5", &ModelConfig::t5_encoder, any_value(),
                       "frozen T5 encoder: a folder with config.json + model.safetensors(.index.json) (FLUX.1's "
                       "text_encoder_2/)")
                  .add("text_encoders.t5_tokenizer", &ModelConfig::t5_tokenizer, any_value(),
                       "T5's spiece.model (FLUX.1's tokenizer_2/spiece.model)")
                  .add("text_encoders.t5_max_length", &ModelConfig::t5_max_length, at_least(1),
                       "T5 tokens per caption, padded (FLUX.1-dev 512, schnell 256)")
                  .add("text_encoders.clip", &ModelConfig::clip_encoder, any_value(),
                       "frozen CLIP text encoder: a folder with config.json + model.safetensors (FLUX.1's text_encoder/)")
                  .add("text_encoders.clip_tokenizer", &ModelConfig::clip_tokenizer, any_value(),
                       "CLIP's vocab.json + merges.txt folder (FLUX.1's tokenizer/) or bpe_simple_vocab_16e6.txt.gz")
                  .section());

  s.push_back(section("flow", &Config::flow)
                  .add("timesteps", &FlowConfig::timesteps,
                       "training timestep distribution")
                  .add("logit_mean", &FlowConfig::logit_mean, any_value(), "logit_normal mean")
                  .add("logit_std", &FlowConfig::logit_std, above(0), "logit_normal std")
                  .add("shift", &FlowConfig::shift, above(0), "resolution shift alpha; 1 = none")
                  .add("resolution_shift", &FlowConfig::resolution_shift, any_value(),
                       "Flux's shift: alpha = exp(mu), mu linear in image tokens through (256, 0.5) and (4096, "
                       "1.15); replaces flow.shift")
                  .section());

  s.push_back(section("data", &Config::data)
                  .add("source", &DataConfig::source,
                       "dataset kind (compositions: `flowtrain data make-compositions`; shards: WebDataset tars, "
                       "`flowtrain data pack`)")
                  .add("path", &DataConfig::path, any_value(), "dataset directory")
                  .add("batch_size", &DataConfig::batch_size, at_least(1), "global batch (all ranks, all micro-batches)")
                  .add("workers", &DataConfig::workers, at_least(0), "loader threads; 0 = load in the training thread")
                  .add("prefetch", &DataConfig::prefetch, at_least(1), "queued batches")
                  .add("shards", &DataConfig::shards, any_value(),
                       "shards: WebDataset tar entries, brace patterns (train-{000000..000099}.tar): local paths, "
                       "http(s):// URLs, s3:// / gs:// objects (a * in the key is listed) or pipe:COMMAND")
                  .add("shard_list", &DataConfig::shard_list, any_value(), "shards: a file of further entries, one a line")
                  .add("shard_index", &DataConfig::shard_index, any_value(),
                       "shards: index.json with sample counts (default: index.json beside local shards; shards "
                       "without one are counted by reading them)")
                  .add("streams", &DataConfig::streams, at_least(0),
                       "shards: canonical streams the shards are dealt to, fixed for a run; >= ranks x workers; 0 = "
                       "auto (min(shards, 4 x ranks x workers))")
                  .add("image_member", &DataConfig::image_member,
                       "shards: the model's input: a decoded .png/.jpg (through model.autoencoder when set: encoded "
                       "in the step), or .latent.safetensors (tensor 'latent')")
                  .add("text_member", &DataConfig::text_member,
                       "models on text embeddings: precomputed (.txt_emb/.vec.safetensors; compositions: "
                       "text_embeddings.safetensors), or the caption encoded in the step by model.text_encoders")
                  .add("buckets", &DataConfig::buckets, any_value(),
                       "shards: aspect-ratio buckets as HxW (pixels, or latent cells), e.g. [56x56, 48x64, 64x48]; "
                       "each batch is of one; images are scaled and centre-cropped to the nearest; flux only")
                  .add("video.frames", &DataConfig::video_frames, at_least(0),
                       "shards: .mp4 members decoded as clips of this many frames (0: no video)")
                  .add("video.fps", &DataConfig::video_fps, at_least(0),
                       "shards: clip frame rate: every round(source fps / this)-th frame (0: every frame)")
                  .add("shuffle_buffer", &DataConfig::shuffle_buffer, at_least(1), "shards: samples per stream's shuffle buffer")
                  .add("on_error", &DataConfig::on_error,
                       "shards: a damaged sample is skipped and counted, or stops the run")
                  .add("max_skip_fraction", &DataConfig::max_skip_fraction, range("[]", 0, 1),
                       "shards: stop when more than this fraction of samples was damaged")
                  .add("record_keys", &DataConfig::record_keys, any_value(),
                       "shards: append each rank's sample keys to <out_dir>/data/keys-rank-RRRRR.txt")
                  .add("skip_batches", &DataConfig::skip_batches, any_value(),
                       "batches of the data order to discard, by ordinal (1 = first drawn): 'N' or 'A-B'")
                  .add("fetch_retries", &DataConfig::fetch_retries, at_least(0), "shards: http(s)/s3 retries with jittered backoff")
                  .add("fetch_timeout_s", &DataConfig::fetch_timeout_s, above(0),
                       "shards: http(s)/s3 connect timeout, and the stall limit (below 1 byte/s)")
                  .section());

  s.push_back(section("optim", &Config::optim)
                  .add("lr", &OptimConfig::lr, range("(]", 0, 1), "peak learning rate")
                  .add("beta1", &OptimConfig::beta1, range("[)", 0, 1), "AdamW beta1")
                  .add("beta2", &OptimConfig::beta2, range("[)", 0, 1), "AdamW beta2")
                  .add("eps", &OptimConfig::eps, above(0), "AdamW epsilon")
                  .add("weight_decay", &OptimConfig::weight_decay, at_least(0), "decoupled weight decay")
                  .add("warmup_steps", &OptimConfig::warmup_steps, at_least(0), "linear warmup steps")
                  .add("schedule", &OptimConfig::schedule, "lr schedule after warmup")
                  .add("min_lr_ratio", &OptimConfig::min_lr_ratio, range("[]", 0, 1), "cosine decays to lr*min_lr_ratio")
                  .add("grad_clip", &OptimConfig::grad_clip, at_least(0), "global-norm clip; 0 = off")
                  .section());

  s.push_back(section("train", &Config::train)
                  .add("steps", &TrainConfig::steps, at_least(1), "optimizer steps")
                  .add("grad_accum", &TrainConfig::grad_accum, at_least(1), "micro-batches per step")
                  .add("precision", &TrainConfig::precision,
                       "bf16 = autocast, fp32 master weights")
                  .add("ema_decay", &TrainConfig::ema_decay, range("[)", 0, 1), "0 = no EMA")
                  .add("ema_warmup", &TrainConfig::ema_warmup, any_value(), "decay min(ema_decay, (1+n)/(10+n)) at step n")
                  .add("log_every", &TrainConfig::log_every, at_least(1), "steps between log lines")
                  .add("threads", &TrainConfig::threads, at_least(0), "intra-op CPU threads; 0 = all cores")
                  .add("tensorboard", &TrainConfig::tensorboard, any_value(), "also write TensorBoard events to tb/")
                  .add("activation_checkpointing", &TrainConfig::activation_checkpointing,
                       "full = recompute block activations in backward (less memory, ~1/3 more compute); "
                       "attention | mlp = recompute only that sublayer of each block")
                  .add("activation_checkpointing_every", &TrainConfig::activation_checkpointing_every, at_least(1),
                       "checkpoint every k-th block (1 = all)")
                  .add("tf32", &TrainConfig::tf32, any_value(),
                       "CUDA: fp32 matmuls on TF32 tensor cores (10-bit mantissa products, fp32 accumulation)")
                  .add("init_from", &TrainConfig::init_from, any_value(),
                       "initial weights (safetensors, reference key names) when starting from scratch; '' = none")
                  .section());

  s.push_back(section("fp8", &Config::fp8)
                  .add("recipe", &Fp8Config::recipe,
                       "fp8 GEMMs for the chosen linears: tensorwise (dynamic per-tensor scales, grads e5m2), rowwise "
                       "(per-row power-of-two scales), rowwise_gw_hp (weight grad in bf16), delayed (scales from an "
                       "amax history), mxfp8 (1x32 blocks, e8m0 scales, OCP's floor exponent), mxfp8_rceil (mxfp8 with "
                       "scales rounded up: nothing saturates)")
                  .add("emulate", &Fp8Config::emulate, any_value(),
                       "quantise, dequantise and multiply in fp32 (same numerics, no fp8 hardware); implied on the CPU")
                  .add("include", &Fp8Config::include, any_value(),
                       "module-name globs of linears to convert ('*' crosses dots); empty = the model's "
                       "transformer blocks")
                  .add("exclude", &Fp8Config::exclude, any_value(), "module-name globs kept in high precision")
                  .add("min_dim", &Fp8Config::min_dim, at_least(1), "linears with fewer in or out features stay high precision")
                  .add("amax_history_len", &Fp8Config::amax_history_len, at_least(1), "delayed: steps of amax history")
                  .add("amax_reduce", &Fp8Config::amax_reduce,
                       "delayed: the history's max, or its newest entry")
                  .add("all_gather", &Fp8Config::all_gather, any_value(),
                       "tensorwise under FSDP: all-gather the converted weights as e4m3 bytes with one scale each "
                       "(a quarter of fp32's traffic, half of bf16's) instead of gathering, then casting")
                  .section());

  s.push_back(section("sample", &Config::sample)
                  .add("every", &SampleConfig::every, at_least(0), "steps between sample grids; 0 = off")
                  .add("num", &SampleConfig::num, at_least(1), "images per grid")
                  .add("steps", &SampleConfig::steps, at_least(1), "ODE solver steps")
                  .add("sampler", &SampleConfig::sampler, "ODE solver")
                  .add("cfg_scale", &SampleConfig::cfg_scale, at_least(0), "classifier-free guidance; 1 = none")
                  .add("seed", &SampleConfig::seed, at_least(0), "sampling noise seed")
                  .section());

  s.push_back(section("checkpoint", &Config::checkpoint)
                  .add("every", &CheckpointConfig::every, at_least(0), "steps between checkpoints; 0 = final only")
                  .add("keep", &CheckpointConfig::keep, at_least(0), "newest checkpoints kept; 0 = all")
                  .add("resume", &CheckpointConfig::resume, non_empty(), "auto | never | checkpoint directory")
                  .add("async", &CheckpointConfig::async, any_value(),
                       "persist in the background; training waits only for the copy to host buffers")
                  .add("on_error", &CheckpointConfig::on_error,
                       "a failed save: stop training, or warn and retry at the next interval")
                  .section());

  s.push_back(section("eval", &Config::eval)
                  .add("every", &EvalConfig::every, at_least(0), "steps between quality evaluations; 0 = off")
                  .add("num", &EvalConfig::num, at_least(2), "generated samples per evaluation")
                  .add("steps", &EvalConfig::steps, at_least(1), "ODE solver steps")
                  .add("sampler", &EvalConfig::sampler, "ODE solver")
                  .add("cfg_scale", &EvalConfig::cfg_scale, at_least(0), "classifier-free guidance; 1 = none")
                  .add("seed", &EvalConfig::seed, at_least(0), "sampling noise seed")
                  .add("classifier_dir", &EvalConfig::classifier_dir, any_value(),
                       "classifier cache; empty = $FLOWTRAIN_DEPS/classifiers")
                  .section());

  s.push_back(section("profile", &Config::profile)
                  .add("enabled", &ProfileConfig::enabled, any_value(), "write a Kineto trace of a few steps")
                  .add("start_step", &ProfileConfig::start_step, at_least(1), "first profiled step")
                  .add("num_steps", &ProfileConfig::num_steps, at_least(1), "profiled steps")
                  .add("record_shapes", &ProfileConfig::record_shapes, any_value(), "record operator input shapes")
                  .add("memory", &ProfileConfig::memory, any_value(), "record allocations")
                  .section());

  s.push_back(section("parallel", &Config::parallel)
                  .add("dp_replicate", &ParallelConfig::dp_replicate, at_least(1), "HSDP replicas (usually nodes)")
                  .add("dp_shard", &ParallelConfig::dp_shard, at_least(-1),
                       "ranks sharing one copy of the weights; -1 = the rest of the world")
                  .add("cp", &ParallelConfig::cp, at_least(1), "context-parallel ranks (sequence split)")
                  .add("cp_attention", &ParallelConfig::cp_attention,
                       "with cp > 1: auto = ulysses when heads % cp == 0, else ring; hybrid = Ulysses inside "
                       "groups of cp_ulysses ranks, ring across them")
                  .add("cp_ulysses", &ParallelConfig::cp_ulysses, at_least(1),
                       "with cp_attention hybrid: the Ulysses degree (divides cp; ring degree = cp / cp_ulysses)")
                  .add("fsdp", &ParallelConfig::fsdp,
                       "auto = shard when world > 1; on = also at world 1")
                  .add("reshard_after_forward", &ParallelConfig::reshard_after_forward, any_value(),
                       "free gathered weights after forward, re-gather in backward")
                  .add("prefetch", &ParallelConfig::prefetch, any_value(), "gather the next unit while one computes")
                  .add("reduce_dtype", &ParallelConfig::reduce_dtype,
                       "gradient reduce-scatter precision")
                  .add("reduce_every_micro_batch", &ParallelConfig::reduce_every_micro_batch, any_value(),
                       "with grad_accum > 1: reduce each micro-batch (less memory) or only the last")
                  .add("backend", &ParallelConfig::backend,
                       "auto = nccl on cuda, gloo on cpu")
                  .add("timeout_s", &ParallelConfig::timeout_s, above(0),
                       "rendezvous/collective timeout; a dead peer ends the job by then")
                  .section());

  s.push_back(section("health", &Config::health)
                  .add("nonfinite", &HealthConfig::nonfinite,
                       "a non-finite loss or gradient: stop (exit 1), skip the update, or roll back to the last "
                       "checkpoint and continue past the batch")
                  .add("max_skips", &HealthConfig::max_skips, at_least(0), "skipped updates allowed in a run, then stop")
                  .add("spike", &HealthConfig::spike,
                       "a loss spike: warn, skip the update, or roll back past the batch")
                  .add("spike_threshold", &HealthConfig::spike_threshold, above(0),
                       "robust z-score (loss - median) / (1.4826 MAD) over the window that makes a spike")
                  .add("spike_ratio", &HealthConfig::spike_ratio, at_least(1),
                       "and the loss must be at least this many times the window median")
                  .add("spike_window", &HealthConfig::spike_window, at_least(8), "steps of loss history")
                  .add("warmup_steps", &HealthConfig::warmup_steps, at_least(0),
                       "no spike, memory-growth or throughput verdicts before this step")
                  .add("straggler_ratio", &HealthConfig::straggler_ratio, above(1),
                       "a rank busier than this many times the median rank is named")
                  .add("memory_growth_mib_per_1k", &HealthConfig::memory_growth_mib_per_1k, above(0),
                       "resident-memory growth (MiB per 1000 steps) that warns")
                  .add("memory_window", &HealthConfig::memory_window, at_least(1),
                       "steps the memory growth rate is fitted over")
                  .add("throughput_drop", &HealthConfig::throughput_drop, above(0),
                       "step time this fraction above the run's median ...")
                  .add("throughput_patience", &HealthConfig::throughput_patience, at_least(1),
                       "... for this many log intervals in a row warns")
                  .add("telemetry_every", &HealthConfig::telemetry_every, at_least(0),
                       "steps between per-block gradient norms and update/weight ratios in metrics; 0 = off")
                  .section());

  s.push_back(section("debug", &Config::debug)
                  .add("allow_inject", &DebugConfig::allow_inject, any_value(), "permit debug.inject.* (tests and drills)")
                  .add("inject.nan_grad_step", &DebugConfig::nan_grad_step, at_least(0),
                       "put a NaN in one gradient at this step; 0 = off")
                  .add("inject.nan_grad_rank", &DebugConfig::nan_grad_rank, at_least(0), "the rank whose gradient")
                  .add("inject.nan_grad_param", &DebugConfig::nan_grad_param, any_value(),
                       "the parameter; empty = the first attention qkv weight")
                  .add("inject.spike_step", &DebugConfig::spike_step, at_least(0),
                       "scale this step's loss by spike_factor; 0 = off")
                  .add("inject.spike_factor", &DebugConfig::spike_factor, above(0), "the loss scale of spike_step")
                  .add("inject.slow_rank", &DebugConfig::slow_rank, at_least(-1), "the slowed rank; -1 = every rank")
                  .add("inject.slow_seconds", &DebugConfig::slow_seconds, at_least(0),
                       "seconds of extra compute per step on slow_rank")
                  .add("inject.slow_worker_seconds", &DebugConfig::slow_worker_seconds, at_least(0),
                       "seconds each batch arrives late on slow_rank (a slow data worker)")
                  .add("inject.slow_from_step", &DebugConfig::slow_from_step, at_least(1),
                       "the first slowed step")
                  .add("inject.leak_mib_per_step", &DebugConfig::leak_mib_per_step, at_least(0),
                       "host memory kept and touched every step (MiB)")
                  .add("inject.reduction", &DebugConfig::reduction,
                       "reduce FSDP gradients wrongly on purpose (tests of the equivalence checks)")
                  .add("inject.encode_kill_after", &DebugConfig::encode_kill_after, at_least(0),
                       "data encode: after this many output shards (this run), SIGKILL the rank mid-way through the next; 0 = off")
                  .add("inject.checkpoint_pause", &DebugConfig::checkpoint_pause, any_value(),
                       "STEP:SECONDS[:torn]: pause after the first file of that step's checkpoint (torn: cut it "
                       "to half first); empty = off")
                  .section());
  return s;
}

const std::vector<Section>& schema() {
  static const std::vector<Section> s = build_schema();
  return s;
}

const Section* find_section(const std::string& name) {
  for (const auto& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> names;
  for (const auto& s : schema()) names.push_back(s.name);
  return names;
}

// A family's keys as keys of the Config (they live in its model section).
std::vector<Key<Config>> family_config_keys(const FamilySpec& family) {
  std::vector<Key<Config>> keys;
  for (const auto& k : family.keys)
    keys.push_back(Key<Config>{k.name, k.allowed, k.help, [at = k.at](Config& c) { return at(c.model); }});
  return keys;
}

// Every key `config` has, in file order: each section's own and, closing the model section, the
// keys of the family its model.arch names.
std::vector<Field> fields_of(const Config& config) {
  std::vector<Field> fields;
  for (const auto& s : schema()) {
    for (const auto& k : s.keys) fields.push_back(Field{s.name, k});
    if (s.name == "model")
      for (auto& k : family_config_keys(model_family(config.model.arch))) fields.push_back(Field{s.name, std::move(k)});
  }
  return fields;
}

// The key of `section` named `key` for a config whose model.arch is `arch`; nullptr when it has none.
std::optional<Field> find_field(const Section& section, const std::string& key, const std::string& arch) {
  if (const Key<Config>* k = section.find(key)) return Field{section.name, *k};
  if (section.name != "model") return std::nullopt;
  for (auto& k : family_config_keys(model_family(arch)))
    if (k.name == key) return Field{section.name, std::move(k)};
  return std::nullopt;
}

// The registered families that have model key `key`.
std::vector<std::string> families_with_key(const std::string& key) {
  return arch_names_where([&](const FamilySpec& f) {
    return std::any_of(f.keys.begin(), f.keys.end(), [&](const auto& k) { return k.name == key; });
  });
}

// A section's key names for messages: the model section's own and every family's.
std::vector<std::string> key_names(const Section& s) {
  std::vector<std::string> names;
  for (const auto& k : s.keys) names.push_back(k.name);
  if (s.name == "model")
    for (const auto& arch : model_arch_names())
      for (const auto& k : model_family(arch).keys)
        if (std::find(names.begin(), names.end(), k.name) == names.end()) names.push_back(k.name);
  return names;
}

bool same_value(const Ref& a, const Ref& b) {
  if (a.index() != b.index()) return false;
  return std::visit(Overloaded{[&](const EnumRef& ea) { return ea.get() == std::get<EnumRef>(b).get(); },
                               [&](auto* pa) {
                                 using P = decltype(pa);
                                 return *pa == *std::get<P>(b);
                               }},
                    a);
}

// ---------------------------------------------------------------------------------------------
// "Did you mean": optimal-string-alignment distance (Levenshtein plus adjacent swaps, since
// "lr"/"rl" typos are common).

size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

// The closest candidate, or nothing when even the closest is so far off that suggesting it
// would mislead.
std::optional<std::string> nearest(const std::string& query, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_d = 0;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(query, c);
    if (!best || d < best_d) {
      best = c;
      best_d = d;
    }
  }
  if (best && best_d <= std::max<size_t>(3, query.size() / 2)) return best;
  return std::nullopt;
}

std::string unknown_key_message(const std::string& section, const std::string& key) {
  if (!find_section(section)) {
    // A whole section is wrong: suggest a section, or, when the key is also given (a --set),
    // the closest full dotted key.
    const std::string shown = key.empty() ? section : section + "." + key;
    auto hint = key.empty() ? nearest(section, section_names()) : nearest(shown, all_keys());
    std::string msg = "unknown key '" + shown + "'";
    if (hint) return msg + " (did you mean '" + *hint + "'?)";
    return msg + " (sections: " + join(section_names(), ", ") + ")";
  }
  const std::string dotted = section + "." + key;
  std::string msg = "unknown key '" + dotted + "'";
  // The key exists in another section: almost certainly a misplaced key, not a typo.
  for (const auto& s : schema()) {
    const std::vector<std::string> names = key_names(s);
    if (std::find(names.begin(), names.end(), key) != names.end())
      return msg + " (did you mean '" + s.name + "." + key + "'?)";
  }
  if (auto hint = nearest(dotted, all_keys())) return msg + " (did you mean '" + *hint + "'?)";
  return msg + " (keys in '" + section + "': " + join(key_names(*find_section(section)), ", ") + ")";
}

// ---------------------------------------------------------------------------------------------
// Scalar conversion. Values are parsed from the scalar text ourselves rather than with
// yaml-cpp's as<T>(), which accepts "1.5" for an int (truncating) and "yes"/"on" for bools.

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "null";
    default: return "'" + n.Scalar() + "'";
  }
}

std::optional<int64_t> parse_int(std::string text) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<double> parse_real(std::string text) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

// Where a value came from: "FILE:LINE" or "--set section.key=value".
std::string at_mark(const std::string& origin, const YAML::Mark& mark) {
  if (mark.line < 0) return origin;
  return origin + ":" + std::to_string(mark.line + 1);
}

[[noreturn]] void fail(const std::string& where, const std::string& msg) {
  throw ConfigError(where.empty() ? msg : where + ": " + msg);
}

// Converts one YAML value into the field, checking type and allowed values.
void assign(const Field& f, const YAML::Node& value, Config& config, const std::string& where) {
  const std::string key = "'" + f.dotted() + "'";
  const Allowed& admitted = f.key.allowed;
  const std::string allowed = admitted.describe();
  const bool scalar = value.IsScalar();
  const std::string text = scalar ? value.Scalar() : "";

  std::visit(
      Overloaded{[&](const EnumRef& e) {
                   if (!scalar) fail(where, key + " must be " + allowed + ", got " + node_kind(value));
                   const auto it = std::find(e.words->begin(), e.words->end(), text);
                   if (it == e.words->end()) fail(where, key + " must be " + allowed + ", got '" + text + "'");
                   e.set(static_cast<size_t>(it - e.words->begin()));
                 },
                 [&](auto* member) {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          auto v = scalar ? parse_int(text) : std::nullopt;
          if (!v) fail(where, key + " must be an integer" + (allowed.empty() ? "" : " " + allowed) + ", got " + node_kind(value));
          if (!admitted.admits(static_cast<double>(*v))) fail(where, key + " must be " + allowed + ", got " + text);
          *member = *v;
        } else if constexpr (std::is_same_v<T, double>) {
          auto v = scalar ? parse_real(text) : std::nullopt;
          if (!v) fail(where, key + " must be a number" + (allowed.empty() ? "" : " " + allowed) + ", got " + node_kind(value));
          if (!admitted.admits(*v)) fail(where, key + " must be " + allowed + ", got " + text);
          *member = *v;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (scalar && text == "true") *member = true;
          else if (scalar && text == "false") *member = false;
          else fail(where, key + " must be true or false, got " + node_kind(value));
        } else if constexpr (std::is_same_v<T, StringList>) {
          // A list of strings; one string alone is a list of one.
          StringList items;
          if (scalar) {
            items.push_back(text);
          } else if (value.IsSequence()) {
            for (const auto& item : value) {
              if (!item.IsScalar()) fail(where, key + " must be a list of strings, got an item that is " + node_kind(item));
              items.push_back(item.Scalar());
            }
          } else if (!value.IsNull()) {
            fail(where, key + " must be a string or a list of strings, got " + node_kind(value));
          }
          for (const auto& item : items)
            if (!admitted.admits(item)) fail(where, key + " items must be " + allowed + ", got '" + item + "'");
          *member = items;
        } else {
          if (!scalar) fail(where, key + " must be " + (allowed.empty() ? "a string" : allowed) + ", got " + node_kind(value));
          if (!admitted.admits(text)) fail(where, key + " must be " + allowed + ", got '" + text + "'");
          *member = text;
        }
      }},
      f.at(config));
}

// ---------------------------------------------------------------------------------------------
// Tree handling.

// Rejects duplicate keys, non-scalar keys and non-map sections before overrides are merged in:
// yaml-cpp keeps both copies of a duplicated key, and operator[] would silently pick one.
void check_structure(const YAML::Node& root, const std::string& origin) {
  if (root.IsNull()) return;
  if (!root.IsMap())
    fail(at_mark(origin, root.Mark()),
         "the top level must be a map of sections (" + join(section_names(), ", ") + "), got " +
             node_kind(root));

  std::map<std::string, int> seen_sections;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const YAML::Node k = it->first;  // copies: binding a reference to it->first dangles
    const YAML::Node v = it->second;
    if (!k.IsScalar()) fail(at_mark(origin, k.Mark()), "section names must be plain strings");
    const std::string name = k.Scalar();
    if (!find_section(name)) fail(at_mark(origin, k.Mark()), unknown_key_message(name, ""));
    if (seen_sections.count(name))
      fail(at_mark(origin, k.Mark()), "duplicate section '" + name + "' (first at line " +
                                          std::to_string(seen_sections[name]) + ")");
    seen_sections[name] = k.Mark().line + 1;
    if (v.IsNull()) continue;  // "optim:" with nothing under it: all defaults
    if (!v.IsMap()) fail(at_mark(origin, v.Mark()), "'" + name + "' must be a map of keys, got " + node_kind(v));

    std::map<std::string, int> seen_keys;
    for (auto kv = v.begin(); kv != v.end(); ++kv) {
      const YAML::Node kk = kv->first;
      if (!kk.IsScalar()) fail(at_mark(origin, kk.Mark()), "keys in '" + name + "' must be plain strings");
      const std::string key = kk.Scalar();
      if (seen_keys.count(key))
        fail(at_mark(origin, kk.Mark()), "duplicate key '" + name + "." + key + "' (first at line " +
                                             std::to_string(seen_keys[key]) + ")");
      seen_keys[key] = kk.Mark().line + 1;
    }
  }
}

// Merges "section.key=value" into the tree; records the override text per dotted key so that
// later errors about the value name the --set rather than a file line.
void apply_override(YAML::Node& root, const std::string& text, std::map<std::string, std::string>& origins) {
  const std::string where = "--set " + text;
  const auto eq = text.find('=');
  if (eq == std::string::npos) fail(where, "malformed override, expected section.key=value");
  const std::string dotted = text.substr(0, eq);
  const std::string raw = text.substr(eq + 1);
  const auto dot = dotted.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == dotted.size())
    fail(where, "malformed override, expected section.key=value");
  const std::string sec = dotted.substr(0, dot);
  const std::string key = dotted.substr(dot + 1);

  // A model key is checked once model.arch is known (convert): which keys the section has depends on it.
  const Section* s = find_section(sec);
  if (!s || (sec != "model" && !s->find(key))) fail(where, unknown_key_message(sec, key));

  YAML::Node value;
  try {
    // Parsed as YAML so that quoting works as in a file ('a b', "x"); an empty value is an
    // empty string rather than null.
    value = raw.empty() ? YAML::Node(std::string()) : YAML::Load(raw);
  } catch (const YAML::Exception& e) {
    fail(where, "cannot parse the value: " + e.msg);
  }
  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  YAML::Node section_node = root[sec];
  section_node[key] = value;
  origins[dotted] = where;
}

// A model key of another family than model.arch's: resolved configs written before each family
// had keys of its own carry every family's keys at their defaults, and such a key changes
// nothing; a key set to anything else would be silently ignored, so it is an error.
void check_foreign_model_key(const std::string& key, const YAML::Node& value, const Config& config,
                             const std::string& where) {
  const std::vector<std::string> owners = families_with_key(key);
  if (owners.empty()) fail(where, unknown_key_message("model", key));
  for (const auto& arch : owners) {
    Config scratch;
    scratch.model.arch = arch;
    const std::optional<Field> f = find_field(*find_section("model"), key, arch);
    try {
      assign(*f, value, scratch, where);
    } catch (const ConfigError&) {
      break;  // not even a valid value of that family's key: the error below says whose key it is
    }
    Config defaults;
    defaults.model.arch = arch;
    if (same_value(f->at(scratch), f->at_const(defaults))) return;
  }
  fail(where, "'model." + key + "' is a key of model.arch " + join(owners, "|") + "; this config's model.arch is " +
                  config.model.arch);
}

void convert(const YAML::Node& root, const std::string& origin,
             const std::map<std::string, std::string>& override_origins, Config& config) {
  if (!root.IsMap()) return;
  auto where_of = [&](const std::string& dotted, const YAML::Node& key_node) {
    auto ov = override_origins.find(dotted);
    return ov != override_origins.end() ? ov->second : at_mark(origin, key_node.Mark());
  };
  // model.arch first: which family's keys the rest of the model section may hold depends on it.
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it->first.Scalar() != "model" || !it->second.IsMap()) continue;
    for (auto kv = it->second.begin(); kv != it->second.end(); ++kv)
      if (kv->first.Scalar() == "arch")
        assign(*find_field(*find_section("model"), "arch", config.model.arch), kv->second, config,
               where_of("model.arch", kv->first));
  }

  auto assign_key = [&](const Section& s, const std::string& key, const YAML::Node& value, const std::string& where) {
    if (const std::optional<Field> f = find_field(s, key, config.model.arch)) return assign(*f, value, config, where);
    if (s.name == "model") return check_foreign_model_key(key, value, config, where);
    fail(where, unknown_key_message(s.name, key));
  };
  for (auto it = root.begin(); it != root.end(); ++it) {
    const Section* s = find_section(it->first.Scalar());
    const YAML::Node body = it->second;
    if (!body.IsMap()) continue;  // null section: defaults (check_structure rejected the rest)
    for (auto kv = body.begin(); kv != body.end(); ++kv) {
      const std::string key = kv->first.Scalar();
      if (s->name == "model" && key == "arch") continue;  // assigned above
      const std::string where = where_of(s->name + "." + key, kv->first);
      // A nested map spells dotted keys: `video: {frames: 8}` is `video.frames: 8`.
      if (kv->second.IsMap() && !find_field(*s, key, config.model.arch)) {
        for (auto sub = kv->second.begin(); sub != kv->second.end(); ++sub)
          assign_key(*s, key + "." + sub->first.Scalar(), sub->second, at_mark(origin, sub->first.Mark()));
        continue;
      }
      assign_key(*s, key, kv->second, where);
    }
  }
}

// Strings that a YAML reader would not read back as the same plain string.
bool needs_quotes(const std::string& s) {
  static const std::set<std::string> special = {"", "~", "null", "Null", "NULL", "true", "True", "TRUE",
                                                "false", "False", "FALSE", "yes", "no", "on", "off"};
  return special.count(s) || parse_real(s).has_value();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

int64_t ModelConfig::resolved_hidden() const { return hidden > 0 ? hidden : model_preset(*this).hidden; }
int64_t ModelConfig::resolved_depth() const { return depth > 0 ? depth : model_preset(*this).depth; }
int64_t ModelConfig::resolved_heads() const { return heads > 0 ? heads : model_preset(*this).heads; }

void Config::validate() const {
  // Per-key checks first: a Config built in code never went through the parser.
  {
    for (const Field& f : fields_of(*this)) {
      const std::string key = "'" + f.dotted() + "'";
      const Allowed& allowed = f.key.allowed;
      std::visit(
          Overloaded{[&](const EnumRef& e) {  // only a cast in code can leave the words
                       if (e.get() >= e.words->size())
                         throw ConfigError(key + " must be " + allowed.describe() + ", got enumerator " +
                                           std::to_string(e.get()));
                     },
                     [&](auto* member) {
            using T = std::remove_cv_t<std::remove_pointer_t<decltype(member)>>;
            if constexpr (std::is_same_v<T, int64_t>) {
              if (!allowed.admits(static_cast<double>(*member)))
                throw ConfigError(key + " must be " + allowed.describe() + ", got " + format_int(*member));
            } else if constexpr (std::is_same_v<T, double>) {
              if (!std::isfinite(*member) || !allowed.admits(*member))
                throw ConfigError(key + " must be " + allowed.describe() + ", got " + format_double(*member));
            } else if constexpr (std::is_same_v<T, std::string>) {
              if (!allowed.admits(*member))
                throw ConfigError(key + " must be " + allowed.describe() + ", got '" + *member + "'");
            } else if constexpr (std::is_same_v<T, StringList>) {
              for (const auto& item : *member)
                if (!allowed.admits(item))
                  throw ConfigError(key + " items must be " + allowed.describe() + ", got '" + item + "'");
            }
          }},
          f.at_const(*this));
    }
  }

  model_family(model.arch).validate(model);  // the family's cross-field checks
  if (model_family(model.arch).objective) {  // trained by an objective of its own: nothing to sample
    if (sample.every > 0)
      throw ConfigError("'sample.every' is " + std::to_string(sample.every) + " but model.arch " + model.arch +
                        " is not sampled (set sample.every 0)");
    if (eval.every > 0)
      throw ConfigError("'eval.every' is " + std::to_string(eval.every) + " but model.arch " + model.arch +
                        " is evaluated on a checkpoint by `flowtrain eval` (reconstruction of the held-out split); "
                        "set eval.every 0");
  }
  // Each frozen text encoder comes with its tokenizer, and only to a family that reads text.
  for (const auto& [encoder, tokenizer, name] :
       {std::tuple{&model.t5_encoder, &model.t5_tokenizer, "t5"}, std::tuple{&model.clip_encoder, &model.clip_tokenizer, "clip"}})
    if (encoder->empty() != tokenizer->empty())
      throw ConfigError(std::string("'model.text_encoders.") + name + "' and 'model.text_encoders." + name +
                        "_tokenizer' go together: set both or neither");
  if ((!model.t5_encoder.empty() || !model.clip_encoder.empty()) && !model_family(model.arch).text_conditioning)
    throw ConfigError("'model.text_encoders.*' are set but model.arch " + model.arch +
                      " reads no text; text encoders serve " + join(arch_names_where([](const FamilySpec& f) {
                        return static_cast<bool>(f.text_conditioning);
                      }), "|"));
  check_batch_split(*this, /*data_parallel=*/1);  // the world is not known yet: resolve() checks it there
  if (parallel.dp_shard == 0)
    throw ConfigError("'parallel.dp_shard' must be >= 1 or -1 (the rest of the world), got 0");
  if (parallel.cp_attention == CpAttentionChoice::hybrid &&
      !(parallel.cp_ulysses > 1 && parallel.cp_ulysses < parallel.cp && parallel.cp % parallel.cp_ulysses == 0))
    throw ConfigError("'parallel.cp_attention' hybrid needs 'parallel.cp_ulysses' to be a divisor of 'parallel.cp' " +
                      std::to_string(parallel.cp) + " strictly between 1 and " + std::to_string(parallel.cp) +
                      " (Ulysses inside, ring across), got " + std::to_string(parallel.cp_ulysses));
  if (parallel.cp_attention != CpAttentionChoice::hybrid && parallel.cp_ulysses != 1)
    throw ConfigError("'parallel.cp_ulysses' " + std::to_string(parallel.cp_ulysses) +
                      " applies to 'parallel.cp_attention' hybrid only (it is '" + name_of(parallel.cp_attention) + "')");
  parse_batch_ordinals(data.skip_batches, "data.skip_batches");  // throws on a malformed item
  if (!debug.checkpoint_pause.empty()) parse_checkpoint_pause(debug.checkpoint_pause);  // throws when malformed
  const bool injects = debug.nan_grad_step > 0 || debug.spike_step > 0 || debug.slow_seconds > 0 ||
                       debug.slow_worker_seconds > 0 || debug.leak_mib_per_step > 0 || debug.reduction != parallel::ReductionFault::None ||
                       !debug.checkpoint_pause.empty() || debug.encode_kill_after > 0;
  if (injects && !debug.allow_inject)
    throw ConfigError("'debug.inject.*' faults are set but 'debug.allow_inject' is false: fault injection is for tests "
                      "and drills and must be allowed explicitly");
  // sample.num >= 1 whenever sample.every > 0 already holds: sample.num's own range is >= 1.
  // checkpoint.resume: "auto", "never" or a path; only emptiness can be wrong here (the path
  // is checked when resuming).
}

std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  for (const auto& s : schema())
    for (const auto& name : key_names(s)) keys.push_back(s.name + "." + name);
  return keys;
}

std::vector<std::string> keys_of(const Config& config) {
  std::vector<std::string> keys;
  for (const Field& f : fields_of(config)) keys.push_back(f.dotted());
  return keys;
}

std::vector<std::string> diff_keys(const Config& a, const Config& b) {
  // Keys of both compare by value; a family key of one side only (model.arch differs) differs.
  const std::vector<Field> fa = fields_of(a), fb = fields_of(b);
  auto find = [](const std::vector<Field>& fields, const std::string& dotted) -> const Field* {
    for (const auto& f : fields)
      if (f.dotted() == dotted) return &f;
    return nullptr;
  };
  std::vector<std::string> keys;
  for (const Field& f : fa) {
    const Field* other = find(fb, f.dotted());
    if (!other || !same_value(f.at_const(a), other->at_const(b))) keys.push_back(f.dotted());
  }
  for (const Field& f : fb)
    if (!find(fa, f.dotted())) keys.push_back(f.dotted());
  return keys;
}

Config parse_config(const std::string& yaml_text, const std::string& origin, const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(origin + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                      ": YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ": YAML error: " + e.msg);
  }

  check_structure(root, origin);
  std::map<std::string, std::string> override_origins;
  for (const auto& o : overrides) apply_override(root, o, override_origins);

  Config config;
  config.source_path = origin;
  convert(root, origin, override_origins, config);
  try {
    config.validate();
  } catch (const ConfigError& e) {
    // Cross-field problems have no single line; name the file they are in.
    throw ConfigError(origin.empty() ? e.what() : origin + ": " + e.what());
  }
  return config;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ConfigError("config file not found: '" + path + "'");
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError("config path is a directory, not a YAML file: '" + path + "'");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) throw ConfigError("cannot read config file '" + path + "'");
  return parse_config(text.str(), path, overrides);
}

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  out << YAML::Comment("flowtrain config, every key resolved (defaults filled in)");
  out << YAML::BeginMap;
  const std::vector<Field> fields = fields_of(config);
  for (const auto& s : schema()) {
    out << YAML::Key << s.name << YAML::Value << YAML::BeginMap;
    for (const Field& f : fields) {
      if (f.section != s.name) continue;
      out << YAML::Key << f.name() << YAML::Value;
      std::string help = f.key.help;
      std::visit(
          Overloaded{[&](const EnumRef& e) {
                       if (needs_quotes(e.word())) out << YAML::DoubleQuoted;
                       out << e.word();
                     },
                     [&](auto* member) {
            using T = std::remove_cv_t<std::remove_pointer_t<decltype(member)>>;
            if constexpr (std::is_same_v<T, int64_t>) {
              out << format_int(*member);
            } else if constexpr (std::is_same_v<T, double>) {
              out << format_double(*member);
            } else if constexpr (std::is_same_v<T, bool>) {
              out << (*member ? "true" : "false");
            } else if constexpr (std::is_same_v<T, StringList>) {
              out << YAML::Flow << YAML::BeginSeq;
              for (const auto& item : *member) {
                if (needs_quotes(item)) out << YAML::DoubleQuoted;
                out << item;
              }
              out << YAML::EndSeq;
            } else {
              if (needs_quotes(*member)) out << YAML::DoubleQuoted;
              out << *member;
            }
          }},
          f.at_const(config));
      // hidden/depth/heads stay 0 so the file round-trips field for field; the comment
      // says what they resolve to.
      if (s.name == "model" && (f.name() == "hidden" || f.name() == "depth" || f.name() == "heads")) {
        try {
          const int64_t v = f.name() == "hidden" ? config.model.resolved_hidden()
                            : f.name() == "depth" ? config.model.resolved_depth()
                                                : config.model.resolved_heads();
          help += " (resolves to " + std::to_string(v) + ")";
        } catch (const ConfigError&) {
          // An unknown size has no resolution; the value itself is still written.
        }
      }
      out << YAML::Comment(help);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace flowtrain::trainer
