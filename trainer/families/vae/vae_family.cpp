// The VAE family (model.arch vae, models/vae/): FLUX.1's autoencoder architecture trained as a VAE by
// `flowtrain train`, exported as an ae.safetensors that model.autoencoder loads (its latents'
// scale and shift measured on the run's data at export, as latent diffusion set its scale factor).
#include "models/vae/vae.h"
#include "trainer/builders.h"
#include "trainer/data_source.h"
#include "trainer/families/vae/vae_config.h"
#include "trainer/families/common.h"
#include "trainer/family.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>


namespace flowtrain::trainer::families {

namespace {

// name -> (ch, ch_mult, num_res_blocks)
struct AutoencoderSize {
  int64_t ch;
  std::vector<int64_t> ch_mult;
  int64_t num_res_blocks;
};
const std::vector<std::pair<std::string, AutoencoderSize>>& sizes() {
  static const std::vector<std::pair<std::string, AutoencoderSize>> s = {
      {"flux-ae", {128, {1, 2, 4, 4}, 2}},  // FLUX.1's: 8× down, 83.8M parameters
      {"ae-small", {32, {1, 2, 4}, 1}},     // 4× down: 56² Fashion compositions -> 14² latents
      {"ae-tiny", {32, {1, 2}, 1}},         // 2× down: tests
  };
  return s;
}
std::vector<std::string> size_names() {
  std::vector<std::string> names;
  for (const auto& [name, size] : sizes()) names.push_back(name);
  return names;
}
AutoencoderSize size_of(const std::string& name) {
  for (const auto& [n, size] : sizes())
    if (n == name) return size;
  throw std::invalid_argument(name);
}


models::AutoencoderOptions autoencoder_options(const ModelConfig& m) {
  const VaeConfig& a = m.family<VaeConfig>();
  models::AutoencoderOptions o;
  o.in_channels = o.out_channels = m.in_channels;
  o.ch = m.resolved_hidden();
  o.ch_mult = a.ch_mult.empty() ? size_of(m.size).ch_mult : parse_positive_ints(a.ch_mult, "ch_mult", "1,2,4,4");
  o.num_res_blocks = m.resolved_depth();
  o.z_channels = a.z_channels;
  o.norm_groups = a.norm_groups;
  o.scale_factor = 1.0;  // training sees unscaled latents; the export measures the scale and shift
  o.shift_factor = 0.0;
  return o;
}

std::vector<Key<ModelConfig>> autoencoder_keys() {
  return family_keys<VaeConfig>()
      .add("ch_mult", &VaeConfig::ch_mult, any_value(),
           "autoencoder: width of level i = hidden x ch_mult[i], e.g. 1,2,4,4 (each level after the first halves "
           "the side); '' = from size")
      .add("z_channels", &VaeConfig::z_channels, at_least(1), "autoencoder: latent channels")
      .add("norm_groups", &VaeConfig::norm_groups, at_least(1), "autoencoder: GroupNorm groups")
      .add("kl_weight", &VaeConfig::kl_weight, at_least(0),
           "autoencoder: weight of the KL term against the mean squared reconstruction error")
      .keys;
}

void validate_autoencoder(const ModelConfig& m) {
  const models::AutoencoderOptions o = autoencoder_options(m);
  if (m.frames != 1)
    throw ConfigError(fmt::format("'model.frames' is {} but the autoencoder is an image model", m.frames));
  if (m.image_size % o.downscale() != 0)
    throw ConfigError(fmt::format("'model.image_size' {} is not divisible by the autoencoder's {}× downsampling "
                                  "({} levels of model.ch_mult)",
                                  m.image_size, o.downscale(), o.levels()));
  for (int64_t level = 0; level < o.levels(); ++level)
    if (o.ch * o.ch_mult[static_cast<size_t>(level)] % o.norm_groups != 0)
      throw ConfigError(fmt::format("'model.norm_groups' {} does not divide the width {} of level {} (model.hidden {} "
                                    "x model.ch_mult {})",
                                    o.norm_groups, o.ch * o.ch_mult[static_cast<size_t>(level)], level, o.ch,
                                    o.ch_mult[static_cast<size_t>(level)]));
}

models::VaeModel& vae(models::DiffusionModel& model) { return dynamic_cast<models::VaeModel&>(model); }

at::Tensor vae_loss(models::DiffusionModel& model, const ModelConfig& m, const at::Tensor& x0,
                    const std::function<uint64_t(int64_t)>& row_seed) {
  models::VaeModel& v = vae(model);
  const int64_t f = v.options.downscale();
  std::vector<at::Tensor> eps;  // each row's ε from its own seed, on the CPU
  for (int64_t row = 0; row < x0.size(0); ++row) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(row_seed(row));
    eps.push_back(at::randn({v.options.z_channels, x0.size(2) / f, x0.size(3) / f}, gen));
  }
  return v.loss(x0, at::stack(eps), m.family<VaeConfig>().kl_weight);
}

// The latents' scale and shift for the exported file: FLUX encodes z = scale · (mean − shift), and
// a flow-matching model learns best from latents of mean 0 and standard deviation 1 (its noise's):
// shift = the mean of the encoder's means over 1,024 training images, scale = 1 / their std.
std::map<std::string, std::string> vae_export_metadata(models::DiffusionModel& model, const Config& config) {
  constexpr int64_t kImages = 1024;
  Config c = config;
  c.data.batch_size = 64;
  c.data.workers = 1;
  std::shared_ptr<const data::ImageDataset> dataset =
      c.data.source == DataSource::shards ? nullptr : build_dataset(c);
  std::unique_ptr<data::BatchSource> source = make_batch_source(c, dataset, 0, 1, c10::Device(at::kCPU), {});
  at::NoGradGuard no_grad;
  model.eval();
  double sum = 0, sum_sq = 0, n = 0;
  for (int64_t seen = 0; seen < kImages;) {
    const data::Batch batch = source->next();
    const at::Tensor mean = vae(model).moments(batch.images.to(at::kFloat)).mean.to(at::kDouble);
    sum += mean.sum().item<double>();
    sum_sq += mean.pow(2).sum().item<double>();
    n += static_cast<double>(mean.numel());
    seen += batch.images.size(0);
  }
  const double shift = sum / n, std = std::sqrt(std::max(sum_sq / n - shift * shift, 1e-12));
  spdlog::info("autoencoder export: latent mean {:.4f}, std {:.4f} over {} training images: shift_factor {:.4f}, "
               "scale_factor {:.4f}",
               shift, std, kImages, shift, 1.0 / std);
  return {{"norm_groups", std::to_string(vae(model).options.norm_groups)},
          {"scale_factor", fmt::format("{}", 1.0 / std)},
          {"shift_factor", fmt::format("{}", shift)}};
}

ModelCost autoencoder_cost(const ModelConfig& m) {
  const models::AutoencoderOptions o = autoencoder_options(m);
  ModelCost cost;
  cost.parameters = models::autoencoder_parameter_count(o);
  cost.train_flops_per_sample = models::vae_train_flops_per_sample(o, m.image_size);
  cost.tokens_per_sample = (m.image_size / o.downscale()) * (m.image_size / o.downscale());
  return cost;
}

// One process: activation checkpointing through the unit runner. Sharded: the two units (encoder,
// decoder) as the transformers' FSDP units; context parallelism does not apply.
Parallelized parallelize_autoencoder(models::DiffusionModel& model, ParallelizeInputs inputs) {
  if (inputs.config->parallel.cp > 1)
    throw ConfigError("'parallel.cp' is " + std::to_string(inputs.config->parallel.cp) +
                      " but the autoencoder has no token sequence to split (set parallel.cp 1)");
  return parallelize_transformer(model, std::move(inputs));
}

}  // namespace

FamilySpec vae_family() {
  FamilySpec spec;
  spec.arch = "vae";
  spec.sizes = size_names();
  spec.preset = [](const std::string& size) {
    return preset_from(
        size, "vae",
        [](const std::string& name) {
          const AutoencoderSize s = size_of(name);
          return ModelPreset{s.ch, s.num_res_blocks, 1};
        },
        size_names());
  };
  spec.keys = autoencoder_keys();
  spec.validate = validate_autoencoder;
  spec.build = [](const ModelConfig& m) {
    return std::make_shared<models::VaeModel>(autoencoder_options(m), m.image_size);
  };
  spec.cost = autoencoder_cost;
  spec.image_tokens = [](const ModelConfig& m) { return autoencoder_cost(m).tokens_per_sample; };
  FamilySpec::Objective objective;
  objective.loss = vae_loss;
  objective.reconstruct = [](models::DiffusionModel& model, const at::Tensor& x) { return vae(model).reconstruct(x); };
  objective.export_metadata = vae_export_metadata;
  spec.objective = std::move(objective);
  spec.parallelize = parallelize_autoencoder;
  return spec;
}

}  // namespace flowtrain::trainer::families
