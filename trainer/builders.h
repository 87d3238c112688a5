// Turns config sections into runtime objects: the device, the model, the data set. The only
// place where the trainer names a concrete model (DiT today; Flux and video DiT join here).
#pragma once

#include "data/image_dataset.h"
#include "data/loader.h"
#include "models/dit.h"
#include "models/flow_matching.h"
#include "trainer/config.h"

#include <c10/core/Device.h>

#include <memory>

namespace flowtrain::trainer {

// run.device: auto -> cuda:<LOCAL_RANK or 0> when a GPU is present, else cpu. Throws ConfigError
// when cuda is requested and none is available.
// `local_rank` (from the launch environment) picks the GPU; −1 reads LOCAL_RANK.
c10::Device select_device(const RunConfig& run, int64_t local_rank = -1);

models::DiTOptions dit_options(const ModelConfig& model);
// `attention` is what every block's attention calls (context-parallel runs pass theirs).
models::DiT build_model(const ModelConfig& model, models::AttentionFn attention = models::default_attention());

// parallel.cp_attention resolved for the model: "ulysses" or "ring" ("auto": Ulysses when the
// heads split over parallel.cp, else ring). Throws ConfigError naming the keys when the model's
// token count does not split evenly over parallel.cp, or Ulysses is asked for and the heads do
// not. Only meaningful for parallel.cp > 1.
std::string context_attention_kind(const Config& config);

// One DiT block's forward in training: under activation checkpointing (recomputed in backward)
// when train.activation_checkpointing selects block `index` and gradients are being recorded,
// else a plain call.
at::Tensor run_block(const TrainConfig& train, int64_t index, const models::BlockCall& call, const at::Tensor& x,
                     const at::Tensor& c);

// Loads data.source; checks the images fit model.in_channels / image_size / num_classes and
// throws ConfigError naming the key otherwise.
std::shared_ptr<const data::ImageDataset> build_dataset(const Config& config);

// The loader and timestep sampler of a run. The trainer and the parity dump of `flowtrain bench`
// both build them here, so the dump reproduces the trainer's first step by construction.
// dp_rank / dp_size: this rank's slice of each global batch (data-parallel ranks only).
data::LoaderOptions loader_options(const Config& config, int64_t dp_rank = 0, int64_t dp_size = 1);
models::TimestepSampler timestep_sampler(const FlowConfig& flow);

// Sets the intra-op thread count (train.threads; 0 = all cores) and returns it.
int configure_threads(const TrainConfig& train);

}  // namespace flowtrain::trainer
