#include "trainer/checkpoint/export.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/family.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

namespace flowtrain::trainer {

std::vector<std::string> export_checkpoint(const ExportOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw std::invalid_argument(fmt::format("--dtype must be fp32 or bf16, got '{}'", o.dtype));
  CheckpointContents c = load_checkpoint(o.checkpoint_dir);
  if (o.ema && c.ema.empty())
    throw CheckpointError(fmt::format("{}: --ema requested but the checkpoint has no EMA weights", o.checkpoint_dir));
  const NamedTensors& source = o.ema ? c.ema : c.model;
  const Config config = parse_config(c.config_yaml, o.checkpoint_dir + "/config");
  const std::vector<std::string> parts = exported_parts(config.model);
  if (parts.size() > 1 && o.text_encoder_out.empty())
    throw CheckpointError(fmt::format("{}: the model has a built-in text encoder; name its file with --text-encoder-out "
                                      "(--out gets the transformer with the reference key names)",
                                      o.checkpoint_dir));
  if (parts.size() == 1 && !o.text_encoder_out.empty())
    throw CheckpointError(fmt::format("{}: --text-encoder-out given but the model has no built-in text encoder",
                                      o.checkpoint_dir));
  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {"source_checkpoint", o.checkpoint_dir},
                                                 {"weights", o.ema ? "ema" : "raw"},
                                                 {"step", std::to_string(c.progress.step)},
                                                 {"flowtrain_config", c.config_yaml}};
  const FamilySpec& family = model_family(config.model.arch);
  if (family.objective && family.objective->export_metadata) {  // e.g. the autoencoder's latent scale and shift
    std::shared_ptr<models::DiffusionModel> model = family.build(config.model);
    load_state_dict(*model, source, o.checkpoint_dir);
    metadata.merge(family.objective->export_metadata(*model, config));
  }
  const std::vector<std::string> paths = {o.out_path, o.text_encoder_out};
  if (parts.size() > 1 && std::filesystem::weakly_canonical(o.out_path) == std::filesystem::weakly_canonical(o.text_encoder_out))
    throw std::invalid_argument(fmt::format("--out and --text-encoder-out are the same file ({})", o.out_path));
  // Every parameter belongs to exactly one part; all parts are written beside their targets and
  // renamed only when all are complete, so a failure leaves no half export.
  std::vector<NamedTensors> outs(parts.size());
  size_t exported = 0;
  for (size_t p = 0; p < parts.size(); ++p)
    for (const auto& [name, t] : source) {
      if (name.compare(0, parts[p].size(), parts[p]) != 0) continue;
      outs[p].emplace_back(name.substr(parts[p].size()), o.dtype == "bf16" ? t.to(at::kBFloat16) : t.to(at::kFloat));
      ++exported;
    }
  if (exported != source.size())
    throw CheckpointError(fmt::format("{}: {} of {} tensors are under none of the model's parts ({})", o.checkpoint_dir,
                                      source.size() - exported, source.size(), fmt::join(parts, ", ")));
  std::vector<std::string> staged;
  try {
    for (size_t p = 0; p < parts.size(); ++p) {
      staged.push_back(paths[p] + ".partial");
      data::write_safetensors(staged.back(), outs[p], metadata);
    }
    for (size_t p = 0; p < parts.size(); ++p) std::filesystem::rename(staged[p], paths[p]);
  } catch (...) {
    std::error_code ignored;
    for (const auto& f : staged) std::filesystem::remove(f, ignored);
    throw;
  }
  std::vector<std::string> first_names;
  for (const auto& [name, t] : outs[0]) first_names.push_back(name);
  return first_names;
}

}  // namespace flowtrain::trainer
