// The seam between the trainer and a model family, in the spirit of TorchTitan's ModelSpec, typed.
// A family is a network under models/ (deriving models::DiffusionModel: pure math, no config,
// files or distribution) plus its spec under trainer/families/<name>/: how the model section of
// the config becomes that network, what it costs, what conditions it, what of it is exported,
// and how it is parallelised. The trainer, CLI, data, evaluation and bench ask the spec; none of
// them names a family (scripts/check_tree.sh fails the build's tests when one does).
//
// A new family is its folder under trainer/families/ and one line in trainer/families/registry.cpp
// (or, for a test or a plugin, one register_family call before the config is loaded).
#pragma once

#include "models/conditioning.h"
#include "models/footprint.h"
#include "models/flow_matching.h"
#include "models/model.h"
#include "trainer/config/config.h"
#include "trainer/config/schema.h"
#include "trainer/parallelize.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// What a size name sets (0 where the family has no such dimension).
struct ModelPreset {
  int64_t hidden = 0, depth = 0, heads = 0;
};

// Size and cost from the config alone: `flowtrain config` reports them for models far larger than
// the machine (flux-dev: 11.9B parameters) without building one.
struct ModelCost {
  int64_t parameters = 0;               // all of them, a built-in text encoder's included
  int64_t text_encoder_parameters = 0;  // of those, the built-in text encoder's
  double train_flops_per_sample = 0;    // 3 × forward
  int64_t tokens_per_sample = 0;
};

// How a text-conditioned model takes its text.
enum class TextInput {
  Tokens,      // caption token ids ("tokens", "txt_mask") through the model's own text encoder
  Embeddings,  // precomputed embeddings: "txt" [length, width], "vec" [pooled_width] (+ "txt_mask")
};

struct TextConditioning {
  TextInput input = TextInput::Embeddings;
  int64_t length = 0;        // text tokens per sample
  int64_t vocab_size = 0;    // Tokens: the token ids its encoder takes
  int64_t width = 0;         // Embeddings: one token's embedding width
  int64_t pooled_width = 0;  // Embeddings: the pooled vector's width
};

struct FamilySpec {
  std::string arch;                // the model.arch value
  std::vector<std::string> sizes;  // the model.size presets it knows
  std::function<ModelPreset(const std::string& size)> preset;  // throws ConfigError for a foreign size
  // The keys it adds to the model section besides ModelConfig's own, on a struct of its own that
  // the family reads as model.family<S>(): family_keys<S>().add(…).keys (trainer/config/schema.h).
  // The schema parses, checks, writes and diffs them with every other key; a config whose
  // model.arch is another family cannot set them.
  std::vector<Key<ModelConfig>> keys;
  // Cross-field checks of the model section beyond the schema's per-key ranges; throws
  // ConfigError naming the keys.
  std::function<void(const ModelConfig&)> validate;
  // The network with its initialisation, drawn from the global CPU generator (seed it first for
  // identical weights on every rank).
  std::function<std::shared_ptr<models::DiffusionModel>(const ModelConfig&)> build;
  std::function<ModelCost(const ModelConfig&)> cost;
  // Each FSDP unit's parameters and what its training forward keeps per sample, in execution
  // order (stem, blocks, head), for the memory estimate (trainer/memory_estimate.h); `cpu_fp32`:
  // the run computes in fp32 on the CPU, where the attention kernels keep other tensors
  // (models/footprint.h). Empty function: no memory estimate for this family.
  std::function<std::vector<models::UnitFootprint>(const ModelConfig&, bool cpu_fp32)> footprint;
  // The visual tokens of one sample at model.image_size (Flux's resolution shift counts them).
  std::function<int64_t(const ModelConfig&)> image_tokens;

  // --- conditioning: at most one of the two is set (neither: an unconditioned model) ------------
  // The conditioning of samples of class `labels` (int64 [B]): training batches of a labelled
  // data set, sample grids and the class-conditional evaluation.
  std::function<models::Conditioning(const at::Tensor& labels)> class_conditioning;
  // With class_conditioning: the labels it takes, 0 … n-1.
  std::function<int64_t(const ModelConfig&)> classes;
  // What text a text-conditioned model reads, for this model section.
  std::function<TextConditioning(const ModelConfig&)> text_conditioning;

  // --- an objective of its own ----------------------------------------------------------------
  // Unset for the generative families: flow matching on the model's velocity
  // (models/flow_matching.h), sampled in grids and judged on samples. Set for a family trained
  // otherwise (the autoencoder): it has no conditioning, is not sampled (sample.every and
  // eval.every 0), and `flowtrain eval` scores its reconstructions of the held-out split.
  struct Objective {
    // Per-sample losses [B] of micro-batch `x0` (as the loader gives it). Any draw for row i uses
    // row_seed(i), a pure function of (run seed, step, the row's index in the global batch): a
    // rerun, and a run at another world size, draws the same.
    std::function<at::Tensor(models::DiffusionModel& model, const ModelConfig& config, const at::Tensor& x0,
                             const std::function<uint64_t(int64_t row)>& row_seed)>
        loss;
    // The model's reconstruction of images x (no draw): what the evaluation scores.
    std::function<at::Tensor(models::DiffusionModel& model, const at::Tensor& x)> reconstruct;
    // `flowtrain export`: metadata of the exported file, from the trained model and its run's
    // config (e.g. the latents' scale and shift, measured on the run's data).
    std::function<std::map<std::string, std::string>(models::DiffusionModel& model, const Config& config)>
        export_metadata;
  };
  std::optional<Objective> objective;

  // --- capabilities -----------------------------------------------------------------------------
  // Position ids follow the sample's shape, so aspect-ratio buckets (data.buckets) can train it.
  bool variable_resolution = false;

  // --- export, reference code -------------------------------------------------------------------
  // The parts `flowtrain export` writes as files of their own, as the module-name prefixes
  // removed from the keys: {""} is one file with the names as they are. `train --init-from FILE`
  // loads FILE into the first part. Empty function: {""}.
  std::function<std::vector<std::string>(const ModelConfig&)> exported_parts;
  // The family's architecture entries of the PyTorch peer's parity dump (bench/pytorch_peer.py
  // reads them to build the same model); throws ConfigError when the peer cannot build this
  // configuration. Empty: the family has no PyTorch peer.
  std::function<std::map<std::string, std::string>(const ModelConfig&)> reference_metadata;
  // `flowtrain sample --dump-inputs`: writes the inputs of the reference implementation's forward
  // at the first sampling step, so a sample can be reproduced in the reference code. Empty: not
  // offered by this family.
  std::function<void(const std::string& path, models::DiffusionModel& model, const at::Tensor& noise,
                      const models::Conditioning& cond, const models::SamplerOptions& sampler)>
      dump_reference_inputs;

  // --- parallelism --------------------------------------------------------------------------------
  // Applies context parallelism, FSDP and activation checkpointing to the built model, in the
  // family's order (trainer/parallelize.h has the transformer families' shared one).
  ParallelizeFn parallelize;
};

// The family of model.arch; throws ConfigError listing the registered ones.
const FamilySpec& model_family(const std::string& arch);
std::vector<std::string> model_arch_names();
std::vector<std::string> model_size_names();  // every family's, each once, for the schema
ModelPreset model_preset(const ModelConfig& model);  // the family's preset of model.size
// Adds a family at run time (tests, plugins): before any config naming it is loaded. Throws
// std::invalid_argument when the arch is taken.
void register_family(FamilySpec spec);
// Removes a family register_family added (a test's toy, at the end of the test); the specs
// handed out for it are gone with it. Throws std::invalid_argument for a built-in or unknown arch.
void unregister_family(const std::string& arch);

// model_family(model.arch).build(model).
std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model);
// The family's exported parts ({""} when it has one).
std::vector<std::string> exported_parts(const ModelConfig& model);
// The class labels a class-conditional model takes; 0 for a text-conditioned one.
int64_t class_count(const ModelConfig& model);
// Whether the model reads captions through its own text encoder (TextInput::Tokens).
bool reads_caption_tokens(const ModelConfig& model);
// The text a text-conditioned model reads; throws ConfigError when model.arch is class-conditional.
TextConditioning text_conditioning(const ModelConfig& model);
// The arch names of the families for which `has(spec)` holds, for messages ("use model.arch …").
std::vector<std::string> arch_names_where(const std::function<bool(const FamilySpec&)>& has);

}  // namespace flowtrain::trainer
