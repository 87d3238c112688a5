#include "trainer/fp8_setup.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <fmt/format.h>

#include <string>

namespace flowtrain::trainer {

namespace fp8 = models::fp8;

namespace {
// Hopper (9.0) and Ada (8.9) have fp8 tensor cores; at::_scaled_mm refuses anything older.
constexpr int kFp8MinComputeCapability = 89;
}  // namespace

fp8::Fp8Options fp8_options(const Config& config, const c10::Device& device) {
  const Fp8Config& c = config.fp8;
  fp8::Fp8Options o;
  o.recipe = c.recipe;
  o.emulate = c.emulate || !device.is_cuda();
  o.include = c.include;
  o.exclude = c.exclude;
  o.min_dim = c.min_dim;
  o.delayed = {c.amax_history_len, c.amax_reduce};
  if (o.recipe == fp8::Recipe::none || o.emulate) return o;
  const auto* props = at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index());
  const int cc = props->major * 10 + props->minor;
  const std::string where = fmt::format("{} is {} (compute capability {}.{})", device.str(), props->name,
                                        props->major, props->minor);
  if (fp8::block_scaled(o.recipe))
    throw ConfigError(fmt::format("'fp8.recipe' {}: block-scaled MX GEMMs are Blackwell hardware and this build "
                                  "does not call them; {}. Set 'fp8.emulate: true' to train with emulated MX numerics",
                                  name_of(c.recipe), where));
  if (cc < kFp8MinComputeCapability)
    throw ConfigError(fmt::format("'fp8.recipe' {} needs fp8 tensor cores (compute capability >= 8.9); {}. Set "
                                  "'fp8.emulate: true' to emulate",
                                  name_of(c.recipe), where));
  o.require_multiple_of_16 = true;
  return o;
}

fp8::Fp8Conversion apply_fp8(models::DiffusionModel& model, const Config& config, const c10::Device& device) {
  fp8::Fp8Options options = fp8_options(config, device);
  if (options.recipe == fp8::Recipe::none) return {};
  if (options.include.empty())  // the default: every block unit (the text encoder and embedders are not blocks)
    for (const std::string& block : model.units().blocks) options.include.push_back(block + ".*");
  fp8::Fp8Conversion conversion = fp8::convert_linears(model, options);
  if (conversion.converted.empty())
    throw ConfigError("'fp8.recipe' is " + name_of(config.fp8.recipe) + " but no linear matched 'fp8.include' / 'fp8.exclude' / "
                      "'fp8.min_dim'" + (conversion.skipped.empty() ? "" : " (first refused: " + conversion.skipped.front() + ")"));
  return conversion;
}

std::vector<std::string> fp8_log_lines(const fp8::Fp8Conversion& conversion, const Config& config,
                                       const c10::Device& device) {
  if (conversion.converted.empty()) return {};
  std::vector<std::string> lines;
  if (!device.is_cuda() && !config.fp8.emulate)
    lines.push_back(fmt::format("fp8: {} has no fp8 GEMM, so fp8.recipe {} is emulated (quantise with the recipe's "
                                "scales, dequantise, multiply in fp32): its numerics, not its speed",
                                device.str(), name_of(config.fp8.recipe)));
  lines.push_back(conversion.summary(fp8_options(config, device)));
  if (config.fp8.all_gather)
    lines.push_back(fmt::format("fp8 all-gather: the {} converted weights are all-gathered as e4m3 bytes with one scale "
                                "each (FSDP units '<unit>.fp8')",
                                conversion.layers.size()));
  return lines;
}

std::map<std::string, std::shared_ptr<models::PrecastWeight>> fp8_all_gather_weights(
    const fp8::Fp8Conversion& conversion, const Config& config, bool sharded) {
  if (!config.fp8.all_gather) return {};
  const std::string where = config.source_path.empty() ? std::string("config") : config.source_path;
  if (config.fp8.recipe != fp8::Recipe::tensorwise)
    throw ConfigError(fmt::format("{}: 'fp8.all_gather' needs 'fp8.recipe' tensorwise (one scale per weight, sent "
                                  "with its bytes), not {}",
                                  where, name_of(config.fp8.recipe)));
  if (!sharded)
    throw ConfigError(fmt::format("{}: 'fp8.all_gather' casts FSDP's weight all-gathers, and this run is not sharded "
                                  "(one process: launch more ranks, or set 'parallel.fsdp: on')",
                                  where));
  std::map<std::string, std::shared_ptr<models::PrecastWeight>> weights;
  for (size_t i = 0; i < conversion.layers.size(); ++i)
    weights[conversion.converted[i] + ".weight"] = conversion.layers[i]->gather_weight_in_fp8();
  return weights;
}

void commit_fp8_amax(const fp8::Fp8Conversion& conversion, parallel::Comm* group) {
  fp8::commit_amax_histories(conversion, [group](at::Tensor& amaxes) {
    if (group != nullptr && group->size() > 1) group->all_reduce(amaxes, parallel::ReduceOp::Max)->wait();
  });
}

}  // namespace flowtrain::trainer
