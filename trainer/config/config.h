// The run configuration: one struct per YAML section, mirroring the file one to one.
//
// Loading goes YAML file → (apply `--set section.key=value` overrides) → typed structs →
// validate(). Every failure is a ConfigError whose message names the file (or "--set"), the
// dotted key and what was allowed, e.g.
//   run.yaml:12: unknown key 'optim.lrr' (did you mean 'optim.lr'?)
//   run.yaml:7: 'train.steps' must be an integer >= 1, got 'ten'
// Nothing is done with a config that did not validate.
#pragma once

#include "models/flow_kinds.h"
#include "models/fp8/recipe_kind.h"
#include "parallel/recompute.h"
#include "parallel/reduction_fault.h"

#include <any>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <typeindex>
#include <vector>

namespace flowtrain::trainer {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Keys with a fixed set of words are enums: the schema parses the word once (an error lists the
// choices) and the code compares enumerators. Enumerators are the YAML words, except `auto`, a
// C++ keyword: `automatic`. Choices that a library takes keep the library's type
// (models::SamplerKind, models::fp8::Recipe, parallel::RecomputePolicy, …).
enum class DeviceChoice { automatic, cpu, cuda };                              // run.device
enum class DataSource { fashion_mnist, compositions, synthetic, shards };     // data.source
enum class ImageMember { image, latent };                                      // data.image_member
enum class TextMember { embeddings, caption };                                 // data.text_member
enum class DamagePolicy { skip, fail };                                        // data.on_error
enum class ScheduleKind { constant, cosine };                                  // optim.schedule
enum class Precision { fp32, bf16 };                                           // train.precision, parallel.reduce_dtype
enum class SaveFailurePolicy { stop, warn };                                   // checkpoint.on_error
enum class CpAttentionChoice { automatic, ulysses, ring, hybrid };             // parallel.cp_attention
enum class FsdpChoice { automatic, on };                                       // parallel.fsdp
enum class BackendChoice { automatic, nccl, gloo };                            // parallel.backend
enum class NonfinitePolicy { stop, skip, rollback };                           // health.nonfinite
enum class SpikePolicy { off, warn, skip, rollback };                          // health.spike

// The words of enum E in enumerator order (value i is words[i]); defined for every enum a key takes.
template <class E>
const std::vector<std::string>& enum_words();
#define FLOWTRAIN_DECLARE_ENUM_WORDS(E) \
  template <>                           \
  const std::vector<std::string>& enum_words<E>();
FLOWTRAIN_DECLARE_ENUM_WORDS(DeviceChoice)
FLOWTRAIN_DECLARE_ENUM_WORDS(DataSource)
FLOWTRAIN_DECLARE_ENUM_WORDS(ImageMember)
FLOWTRAIN_DECLARE_ENUM_WORDS(TextMember)
FLOWTRAIN_DECLARE_ENUM_WORDS(DamagePolicy)
FLOWTRAIN_DECLARE_ENUM_WORDS(ScheduleKind)
FLOWTRAIN_DECLARE_ENUM_WORDS(Precision)
FLOWTRAIN_DECLARE_ENUM_WORDS(SaveFailurePolicy)
FLOWTRAIN_DECLARE_ENUM_WORDS(CpAttentionChoice)
FLOWTRAIN_DECLARE_ENUM_WORDS(FsdpChoice)
FLOWTRAIN_DECLARE_ENUM_WORDS(BackendChoice)
FLOWTRAIN_DECLARE_ENUM_WORDS(NonfinitePolicy)
FLOWTRAIN_DECLARE_ENUM_WORDS(SpikePolicy)
FLOWTRAIN_DECLARE_ENUM_WORDS(models::TimestepDistribution)
FLOWTRAIN_DECLARE_ENUM_WORDS(models::SamplerKind)
FLOWTRAIN_DECLARE_ENUM_WORDS(models::fp8::Recipe)
FLOWTRAIN_DECLARE_ENUM_WORDS(models::fp8::AmaxReduce)
FLOWTRAIN_DECLARE_ENUM_WORDS(parallel::RecomputePolicy)
FLOWTRAIN_DECLARE_ENUM_WORDS(parallel::ReductionFault)
#undef FLOWTRAIN_DECLARE_ENUM_WORDS

// The YAML word of `value` (logs, messages, to_yaml).
template <class E>
const std::string& name_of(E value) {
  return enum_words<E>().at(static_cast<size_t>(value));
}

struct RunConfig {
  std::string name = "run";
  std::string out_dir = "runs/run";
  int64_t seed = 0;
  DeviceChoice device = DeviceChoice::automatic;  // auto: cuda when a GPU is present
};

// The keys a model family adds to the `model:` section, one typed struct per family (its spec
// declares them: trainer/family.h FamilySpec::keys), kept by its type. A struct is made, at its
// defaults, on first use, also through a const config: "not set" reads as the defaults, and the
// schema's accessors (which read through the same pointers they write through) need a place.
// Loading a config touches its family's struct, so later readers on other threads only look up.
class FamilySections {
 public:
  template <class S>
  S& get() const {
    std::any& held = sections_[std::type_index(typeid(S))];
    if (!held.has_value()) held = S{};
    return std::any_cast<S&>(held);
  }

 private:
  mutable std::map<std::type_index, std::any> sections_;
};

// The keys every family has: which family, its size, the width and depth of its transformer and
// the shape of one sample [in_channels, frames, image_size, image_size]. The family's own keys
// (the DiT's classes, the Flux text path's widths, …) are its section struct: family<S>().
struct ModelConfig {
  std::string arch = "dit";     // a registered model family (trainer/family.h; trainer/families/)
  std::string size = "S";       // a preset of the family: dit tiny | S | B | L | XL; flux flux-dev | …
  int64_t hidden = 0;           // 0 = from size
  int64_t depth = 0;            // 0 = from size (flux: double-stream blocks)
  int64_t heads = 0;            // 0 = from size
  double mlp_ratio = 4.0;
  int64_t patch = 2;            // 2 | 4 | 8 (any divisor of image_size is accepted)
  int64_t image_size = 32;      // input side (pixels or latent cells)
  int64_t frames = 1;           // frames per sample; > 1 is a video model on clips [C, T, H, W]
  int64_t in_channels = 4;
  // The frozen models of the FLUX stack, as a release ships them (trainer/frozen/): read by
  // `flowtrain data encode` (and, to come, by training that encodes each batch itself).
  std::string autoencoder = "";     // ae.safetensors
  std::string t5_encoder = "";      // text_encoders.t5: folder with config.json + weights
  std::string t5_tokenizer = "";    // text_encoders.t5_tokenizer: spiece.model
  int64_t t5_max_length = 512;      // text_encoders.t5_max_length: FLUX.1-dev 512, schnell 256
  std::string clip_encoder = "";    // text_encoders.clip: folder with config.json + model.safetensors
  std::string clip_tokenizer = "";  // text_encoders.clip_tokenizer: vocab.json + merges.txt folder, or bpe .txt(.gz)

  FamilySections sections;
  template <class S>
  const S& family() const { return sections.get<S>(); }
  template <class S>
  S& family() { return sections.get<S>(); }

  // Resolved from the family's size preset unless given explicitly (trainer/family.h).
  int64_t resolved_hidden() const;
  int64_t resolved_depth() const;
  int64_t resolved_heads() const;
};

struct FlowConfig {
  models::TimestepDistribution timesteps = models::TimestepDistribution::LogitNormal;
  double logit_mean = 0.0;
  double logit_std = 1.0;
  double shift = 1.0;  // resolution shift alpha: t' = a·t / (1 + (a−1)·t); 1 = none
  // Flux's resolution-dependent shift: alpha = exp(mu), mu linear in the image tokens through
  // (256, 0.5) and (4096, 1.15) (black-forest-labs/flux sampling.get_schedule); replaces shift.
  bool resolution_shift = false;
};

struct DataConfig {
  DataSource source = DataSource::fashion_mnist;
  std::string path = "/usr/share/datasets/fashion-mnist";
  int64_t batch_size = 64;  // global batch (all ranks, all micro-batches)
  int64_t workers = 2;      // background threads assembling batches
  int64_t prefetch = 4;     // bounded queue depth in batches
  // source: shards (data/shards/): WebDataset tars from local paths, http(s) or pipe: commands.
  std::vector<std::string> shards;  // brace patterns
  std::string shard_list = "";      // a file of entries, one a line
  std::string shard_index = "";     // sample counts (default: index.json beside local shards)
  int64_t streams = 0;              // canonical streams; 0 = auto
  ImageMember image_member = ImageMember::image;  // png/jpg, or .latent.safetensors
  TextMember text_member = TextMember::embeddings;  // text-embedding models: txt_emb/vec, or .txt encoded online
  std::vector<std::string> buckets;    // aspect-ratio buckets "HxW"; empty: one shape
  int64_t video_frames = 0;            // .mp4 members: frames per clip (0: not video)
  double video_fps = 0;                // clip frame rate (0: the video's own)
  int64_t shuffle_buffer = 256;     // per stream
  DamagePolicy on_error = DamagePolicy::skip;
  double max_skip_fraction = 0.01;
  bool record_keys = false;
  // Batches of the run's data order to discard, by ordinal (1 = the first batch drawn), "N" or
  // "A-B": restarting past bad data (PaLM's remedy for loss spikes); `health:` lines name them.
  std::vector<std::string> skip_batches;
  int64_t fetch_retries = 5;
  double fetch_timeout_s = 60.0;
};

struct OptimConfig {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t warmup_steps = 0;
  ScheduleKind schedule = ScheduleKind::constant;
  double min_lr_ratio = 0.0;          // cosine decays to lr·min_lr_ratio
  double grad_clip = 1.0;             // global-norm clip; 0 = off
};

struct TrainConfig {
  int64_t steps = 1000;
  int64_t grad_accum = 1;
  Precision precision = Precision::fp32;  // bf16: autocast, fp32 master weights
  // The one reading of `precision`: bf16 means the forward runs under bf16 autocast.
  bool bf16_autocast() const { return precision == Precision::bf16; }
  double ema_decay = 0.9999;       // 0 = no EMA (sampling then uses the raw weights)
  bool ema_warmup = true;          // decay_n = min(ema_decay, (1 + n) / (10 + n)) after n steps
  int64_t log_every = 10;
  int64_t threads = 0;             // intra-op CPU threads; 0 = all cores
  bool tensorboard = true;         // also write TensorBoard event files to <out_dir>/tb
  // Recompute the selected blocks' activations (full) or one sublayer's (attention | mlp,
  // selective) in backward — memory for compute
  parallel::RecomputePolicy activation_checkpointing = parallel::RecomputePolicy::none;
  int64_t activation_checkpointing_every = 1;  // every k-th block (1 = all)
  bool tf32 = true;  // CUDA: fp32 matmuls on TF32 tensor cores (PyTorch's "high" matmul precision)
  // Initial weights of a run that starts from scratch: a safetensors file with the reference key
  // names (a Flux transformer: flowtrain export's --out, or BFL's checkpoints), loaded strictly.
  std::string init_from = "";
};

// FP8 compute for the block linears (models/fp8/, docs/fp8.md). Master weights stay fp32 and the
// checkpoint format does not change; only how the GEMMs of the chosen linears compute.
struct Fp8Config {
  models::fp8::Recipe recipe = models::fp8::Recipe::none;
  bool emulate = false;         // quantise + dequantise + fp32 GEMM (implied on the CPU)
  std::vector<std::string> include;  // empty = every transformer block of the model (its block units)
  std::vector<std::string> exclude = {"*adaLN_modulation*", "*_mod.*", "*.modulation.*"};
  int64_t min_dim = 16;            // smaller linears stay in high precision
  int64_t amax_history_len = 16;   // delayed: steps of amax history
  models::fp8::AmaxReduce amax_reduce = models::fp8::AmaxReduce::max;  // delayed: over the history
  bool all_gather = false;  // FSDP: gather the converted weights as e4m3 with their scale (tensorwise)
};

struct SampleConfig {
  int64_t every = 500;   // 0 = off
  int64_t num = 100;     // images per grid (rows cycle through the classes)
  int64_t steps = 50;
  models::SamplerKind sampler = models::SamplerKind::Euler;
  double cfg_scale = 1.5;
  int64_t seed = 0;
};

struct CheckpointConfig {
  int64_t every = 500;   // 0 = off (a final checkpoint is still written at the end)
  int64_t keep = 3;      // newest complete checkpoints kept; 0 = keep all
  std::string resume = "auto";  // auto | never | PATH to a checkpoint directory
  // Asynchronous saves (trainer/checkpoint/checkpoint_saver.h): training is blocked only while
  // the state is copied to host buffers (one more copy of this rank's state in host memory).
  bool async = true;
  // A save that fails (disk full, I/O error): "stop" ends training with the error (every rank at
  // the same step); "warn" logs it, counts it in metrics (checkpoint_failures) and saves again at
  // the next interval. Either way the failed directory is removed, never left complete-looking.
  SaveFailurePolicy on_error = SaveFailurePolicy::stop;
};

// Model-quality evaluation (flowtrain eval, and periodically during training): samples scored
// by a small Fashion-MNIST classifier the project trains itself (FD, class accuracy, IS).
struct EvalConfig {
  int64_t every = 0;       // steps between evaluations during training; 0 = off
  int64_t num = 1000;      // generated samples per evaluation
  int64_t steps = 30;
  models::SamplerKind sampler = models::SamplerKind::Heun;
  double cfg_scale = 1.5;
  int64_t seed = 1;
  std::string classifier_dir = "";  // classifier cache; "" = $FLOWTRAIN_DEPS/classifiers (~/.cache/flowtrain)
};

// Kineto (CPU + CUDA) trace of a few steps: <out_dir>/profiles/rank-R-step-S.json (Perfetto).
struct ProfileConfig {
  bool enabled = false;
  int64_t start_step = 10;  // first profiled step (after warm-up)
  int64_t num_steps = 3;
  bool record_shapes = false;
  bool memory = false;      // record allocations (profile_memory)
};

// Distributed training (parallel/): the device mesh dp_replicate × dp_shard × cp = world size
// (the world comes from the launch environment: Slurm, torchrun/Kubeflow, a Kubernetes Indexed
// Job or `flowtrain launch`), and the FSDP-style sharding knobs.
struct ParallelConfig {
  int64_t dp_replicate = 1;           // HSDP replicas (all-reduce across them); usually = nodes
  int64_t dp_shard = -1;              // ranks a parameter is sharded over; −1 = the rest of the world
  int64_t cp = 1;                     // context parallelism (sequence split); 1 = off
  CpAttentionChoice cp_attention = CpAttentionChoice::automatic;  // auto: ulysses when heads % cp == 0, else ring
  int64_t cp_ulysses = 1;             // hybrid: Ulysses degree inside cp (ring across cp / cp_ulysses groups)
  FsdpChoice fsdp = FsdpChoice::automatic;  // auto: shard when world > 1 | on: also at world 1 (traces, tests)
  bool reshard_after_forward = true;  // free gathered weights after each unit's forward (re-gather in backward)
  bool prefetch = true;               // gather unit i+1 while unit i computes (both directions)
  Precision reduce_dtype = Precision::fp32;  // gradient reduce-scatter precision
  bool reduce_every_micro_batch = false;  // grad_accum > 1: reduce-scatter each micro-batch (less memory)
  BackendChoice backend = BackendChoice::automatic;  // auto: nccl on cuda, gloo on cpu
  double timeout_s = 600;             // rendezvous and collective timeout: a dead peer ends the job by then
};

// Training health (trainer/health/): what is watched every step and every log interval, and
// what is done about it. docs/health.md has the detectors' definitions.
struct HealthConfig {
  NonfinitePolicy nonfinite = NonfinitePolicy::stop;  // a non-finite loss or gradient
  int64_t max_skips = 10;           // skipped updates allowed in a run (non-finite and spikes); then stop
  SpikePolicy spike = SpikePolicy::warn;  // a loss spike
  double spike_threshold = 8.0;     // robust z: (loss − median) / (1.4826 · MAD) over the window …
  double spike_ratio = 2.0;         // … and loss ≥ ratio × median: both make a spike
  int64_t spike_window = 100;       // steps of loss history (spikes themselves left out)
  int64_t warmup_steps = 100;       // no spike, memory or throughput verdicts before this step
  double straggler_ratio = 1.5;     // a rank busier than this × the median rank is named
  double memory_growth_mib_per_1k = 256;  // resident-memory growth rate that warns
  int64_t memory_window = 2000;     // steps the growth rate is fitted over
  double throughput_drop = 0.1;     // step time this fraction above the run's median …
  int64_t throughput_patience = 3;  // … for this many log intervals in a row warns
  int64_t telemetry_every = 0;      // steps between per-block gradient norms and update/weight ratios; 0 = off
};

// Fault injection for tests and drills (trainer/health/fault_injection.h); refused unless
// allow_inject. Steps are 1-based optimizer steps; 0 = that fault is off.
struct DebugConfig {
  bool allow_inject = false;
  int64_t nan_grad_step = 0;
  int64_t nan_grad_rank = 0;
  std::string nan_grad_param = "";  // "" = the first attention qkv weight (the first block's)
  int64_t spike_step = 0;
  double spike_factor = 10.0;
  int64_t slow_rank = -1;           // -1 = every rank
  double slow_seconds = 0;          // compute: sleeps this long per step on slow_rank
  double slow_worker_seconds = 0;   // data: the batch arrives this much later on slow_rank
  int64_t slow_from_step = 1;
  double leak_mib_per_step = 0;     // host memory kept (and touched) every step
  // A deliberately wrong FSDP gradient reduction (parallel/reduction_fault.h).
  parallel::ReductionFault reduction = parallel::ReductionFault::None;
  // "STEP:SECONDS" pauses after the first file of that step's checkpoint is written (a kill then
  // lands mid-save); "STEP:SECONDS:torn" first cuts that file to half its bytes. "" = off.
  std::string checkpoint_pause = "";
  // `flowtrain data encode`: after this many output shards finished in this run, a rank kills
  // itself (SIGKILL) halfway through the first batch of its next shard, whose temporary file is
  // then half-written. 0 = off.
  int64_t encode_kill_after = 0;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  FlowConfig flow;
  DataConfig data;
  OptimConfig optim;
  TrainConfig train;
  Fp8Config fp8;
  SampleConfig sample;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  ProfileConfig profile;
  ParallelConfig parallel;
  HealthConfig health;
  DebugConfig debug;

  std::string source_path;  // the YAML file it came from ("" for defaults)

  // Throws ConfigError naming the key on any cross-field inconsistency
  // (hidden % heads, image_size % patch, batch_size % grad_accum, …).
  void validate() const;
};

// Loads a YAML file, applies overrides ("section.key=value", later wins), converts and
// validates. Throws ConfigError.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Parses YAML text as if it came from `origin` (used for tests and for resolved configs
// stored in checkpoints).
Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// The fully resolved config as YAML (every key it has, defaults filled in: keys_of), loadable
// by load_config.
std::string to_yaml(const Config& config);

// Every valid dotted key ("optim.lr", …) in file order, every family's model keys included;
// used for "did you mean" and docs.
std::vector<std::string> all_keys();
// The keys `config` has: every section's own and the model.arch family's, in file order (to_yaml's).
std::vector<std::string> keys_of(const Config& config);

// Dotted keys whose values differ between two configs, in file order (empty = same settings;
// source_path is not a setting). For round-trip checks and "config changed since the
// checkpoint" messages on resume.
std::vector<std::string> diff_keys(const Config& a, const Config& b);

}  // namespace flowtrain::trainer
