// Turns config sections into runtime objects: the device, the data set, the loader, the timestep
// sampler, threads. (Models are built by their family: trainer/family.h; parallelised by
// trainer/parallelize.h.)
#pragma once

#include "data/image_dataset.h"
#include "data/loader.h"
#include "models/model.h"
#include "models/flow_matching.h"
#include "trainer/config/config.h"

#include <c10/core/Device.h>

#include <memory>

namespace flowtrain::trainer {

// run.device: auto -> cuda when a GPU is present, else cpu; the GPU is
// cuda_device_for_rank(`local_rank` (−1: read LOCAL_RANK), visible devices). Throws ConfigError
// when cuda is requested and none is available, or the rank has no GPU of its own.
c10::Device select_device(const RunConfig& run, int64_t local_rank = -1);
// The CUDA device index of a rank: LOCAL_RANK when the process sees its node's GPUs, 0 when it
// sees exactly one (CUDA_VISIBLE_DEVICES set per task), i.e. LOCAL_RANK % device_count; a
// LOCAL_RANK beyond several visible devices is a ConfigError naming CUDA_VISIBLE_DEVICES
// (`visible_devices`, "" = unset).
int64_t cuda_device_for_rank(int64_t local_rank, int64_t device_count, const std::string& visible_devices);
// On a CUDA device: makes it the process's current device (before any CUDA work or
// communicator) and sets the fp32 matmul precision from train.tf32. No-op on the CPU.
void configure_cuda(const c10::Device& device, const TrainConfig& train);

// Loads data.source (compositions: with its text fields, trainer/run_conditioning.h); checks the images fit model.in_channels / image_size / num_classes and
// throws ConfigError naming the key otherwise. Null for data.source shards (streamed, not loaded).
std::shared_ptr<const data::ImageDataset> build_dataset(const Config& config);

// The loader and timestep sampler of a run. The trainer and the parity dump of `flowtrain bench`
// both build them here, so the dump reproduces the trainer's first step by construction.
// dp_rank / dp_size: this rank's slice of each global batch (data-parallel ranks only).
// `device`: a CUDA device makes the loader pin its batches.
data::LoaderOptions loader_options(const Config& config, int64_t dp_rank = 0, int64_t dp_size = 1,
                                   const c10::Device& device = c10::Device(c10::kCPU));
models::TimestepSampler timestep_sampler(const Config& config);
// The time shift α of training and sampling: flow.shift, or with flow.resolution_shift Flux's
// exp(μ), μ = 0.5 + (1.15 − 0.5)·(L − 256) / (4096 − 256) for L = (model.image_size / model.patch)²
// image tokens (black-forest-labs/flux sampling.py get_schedule: its time_shift(μ, 1, t) is
// t' = α·t / (1 + (α − 1)·t) with α = e^μ, the flow.shift formula).
double time_shift(const Config& config);

// Sets the intra-op thread count (train.threads; 0 = all cores) and returns it.
int configure_threads(const TrainConfig& train);

}  // namespace flowtrain::trainer
