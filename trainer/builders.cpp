#include "trainer/builders.h"

#include "trainer/config/resolve.h"

#include "data/compositions.h"
#include "data/fashion_mnist.h"
#include "trainer/family.h"
#include "trainer/frozen/online_encoding.h"
#include "trainer/run_conditioning.h"
#include "trainer/telemetry/memory_stats.h"

#include <ATen/Parallel.h>
#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <cmath>
#include <fmt/format.h>

#include <cstdlib>
#include <thread>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace flowtrain::trainer {

int64_t cuda_device_for_rank(int64_t local_rank, int64_t device_count, const std::string& visible_devices) {
  if (device_count <= 0) throw ConfigError("'run.device' is cuda but no CUDA device is visible");
  if (local_rank < 0) return 0;
  // One visible device: the launcher gave each rank its own (CUDA_VISIBLE_DEVICES per task).
  if (device_count == 1 || local_rank < device_count) return local_rank % device_count;
  throw ConfigError(fmt::format(
      "LOCAL_RANK is {} but this process sees only {} CUDA devices (CUDA_VISIBLE_DEVICES={}): start at most one rank "
      "per visible GPU on a node, or give each rank its own GPU (CUDA_VISIBLE_DEVICES per task, e.g. srun "
      "--gpus-per-task=1)",
      local_rank, device_count, visible_devices.empty() ? "<unset>" : visible_devices));
}

c10::Device select_device(const RunConfig& run, int64_t local_rank) {
  if (resolve_device(run, at::hasCUDA() ? at::getNumGPUs() : 0) == c10::kCPU) return c10::Device(c10::kCPU);
  if (local_rank < 0)
    if (const char* env = std::getenv("LOCAL_RANK")) local_rank = std::atoi(env);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const int64_t index = cuda_device_for_rank(local_rank, at::getNumGPUs(), visible ? visible : "");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void configure_cuda(const c10::Device& device, const TrainConfig& train) {
  if (!device.is_cuda()) return;
  // The current device before anything touches CUDA (the NCCL communicators are bound to it too),
  // so no rank ever creates a context on another rank's GPU.
  c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).setDevice(device);
  // PyTorch's float32 matmul precision: "high" lets cuBLAS use TF32 tensor cores for fp32 GEMMs.
  at::globalContext().setFloat32MatmulPrecision(train.tf32 ? "high" : "highest");
}

std::shared_ptr<const data::ImageDataset> build_dataset(const Config& c) {
  if (c.data.source == DataSource::shards) return nullptr;  // streamed by the shard loader (trainer/data_source.h)
  auto dataset = std::make_shared<data::ImageDataset>();
  if (c.data.source == DataSource::fashion_mnist) {
    *dataset = data::load_fashion_mnist(c.data.path, "train");
  } else if (c.data.source == DataSource::compositions) {  // captioned canvases: no classes, text fields
    data::CompositionSet set = data::load_compositions(c.data.path, "train");
    std::vector<std::string> captions;
    for (const auto& item : set.items) captions.push_back(item.caption);
    dataset->images = set.images;
    dataset->labels = at::zeros({set.images.size(0)}, at::kLong);
    if (model_family(c.model.arch).text_conditioning) dataset->fields = text_fields(c, captions);  // else images only
  } else {  // synthetic: sized like the model's input, for benchmarks and data-free tests
    // Clips for a video model; fewer of them (a 32-frame 64² clip of 4 channels is 0.5 MB).
    const int64_t n = std::max<int64_t>(c.model.frames > 1 ? 64 : 4096, c.data.batch_size);
    // A text-conditioned model's samples carry the one label 0 (the labels are drawn after the
    // images, so their count changes no image).
    const int64_t classes = std::max<int64_t>(1, class_count(c.model));
    const DataInput input = data_input(c);  // pixels when the step encodes them
    *dataset = data::make_synthetic_dataset(n, input.channels, input.image_size, classes,
                                            static_cast<uint64_t>(c.run.seed), c.model.frames);
    if (model_family(c.model.arch).text_conditioning) dataset->fields = synthetic_text_fields(c, dataset->size());
  }
  const std::string where = c.source_path.empty() ? std::string("config") : c.source_path;
  if (c.model.frames > 1 && dataset->images.dim() != 5)
    throw ConfigError(fmt::format("{}: 'model.frames' is {} (a video model) but data.source '{}' holds images: train "
                                  "it on clips (data.source shards with data.video.frames {}, or synthetic)",
                                  where, c.model.frames, name_of(c.data.source), c.model.frames));
  const int64_t channels = dataset->images.size(-3), side = dataset->images.size(-1);
  const DataInput input = data_input(c);  // the autoencoder's pixels when it encodes in the step
  const std::string through_ae = input.downsampling > 1 ? fmt::format(" (the input of model.autoencoder {})", c.model.autoencoder) : "";
  if (channels != input.channels)
    throw ConfigError(fmt::format("{}: the model takes {}-channel images{} but data.source '{}' has {}-channel images",
                                  where, input.channels, through_ae, name_of(c.data.source), channels));
  if (side > input.image_size)
    throw ConfigError(fmt::format("{}: 'model.image_size' {} takes images up to {}×{}{} but data.source '{}' has {}×{} "
                                  "images (smaller images are padded)",
                                  where, c.model.image_size, input.image_size, input.image_size, through_ae,
                                  name_of(c.data.source), side, side));
  const int64_t classes = class_count(c.model);
  if (classes > 0 && dataset->num_classes > classes)
    throw ConfigError(fmt::format("{}: 'model.num_classes' is {} but data.source '{}' has {} classes", where,
                                  classes, name_of(c.data.source), dataset->num_classes));
  return dataset;
}

data::LoaderOptions loader_options(const Config& c, int64_t dp_rank, int64_t dp_size, const c10::Device& device) {
  data::LoaderOptions lo;
  lo.pin_memory = device.is_cuda();
  lo.rank = dp_rank;
  lo.world = dp_size;
  lo.global_batch = c.data.batch_size;
  lo.workers = c.data.workers;
  lo.prefetch = c.data.prefetch;
  lo.seed = static_cast<uint64_t>(c.run.seed);
  lo.image_size = data_input(c).image_size;
  return lo;
}

double time_shift(const Config& c) {
  if (!c.flow.resolution_shift) return c.flow.shift;
  // Every visual token counts: a clip's frames / patch_t times the tokens of one frame.
  const double tokens = static_cast<double>(model_family(c.model.arch).image_tokens(c.model));
  const double mu = 0.5 + (1.15 - 0.5) / (4096.0 - 256.0) * (tokens - 256.0);
  return std::exp(mu);
}

models::TimestepSampler timestep_sampler(const Config& c) {
  return {c.flow.timesteps, c.flow.logit_mean, c.flow.logit_std, time_shift(c)};
}

namespace {

void keep_activation_pages_between_steps() {
  // LibTorch's CPU tensors come straight from malloc. glibc's defaults serve blocks above a
  // dynamic threshold with fresh mmaps and trim the heap top once more than 2× that is free, so
  // every step re-faults (and the kernel zeroes) the pages of its large activations: ~2 ms per
  // 12.8 MB tensor here. Blocks up to 32 MiB from the heap, no trimming below 1 GiB: the step's
  // activations reuse the same pages. Peak memory is unchanged (the peak is the same
  // allocations); the process keeps it between steps. FLOWTRAIN_MALLOC_DEFAULTS=1 keeps glibc's.
#if defined(__GLIBC__)
  static const bool keep_defaults = [] {
    const char* v = std::getenv("FLOWTRAIN_MALLOC_DEFAULTS");
    return v && *v == '1';
  }();
  if (!keep_defaults) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
#endif
}

}  // namespace

// Every command that computes calls this once at start: threads, and the allocator with them.
int configure_threads(const TrainConfig& train) {
  int threads = static_cast<int>(train.threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  keep_activation_pages_between_steps();
  install_memory_tracking();
  return threads;
}

}  // namespace flowtrain::trainer
