#include "trainer/checkpoint/export.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"
#include "trainer/model_registry.h"

#include <fmt/format.h>

namespace flowtrain::trainer {

std::vector<std::string> export_checkpoint(const ExportOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw std::invalid_argument(fmt::format("--dtype must be fp32 or bf16, got '{}'", o.dtype));
  CheckpointContents c = load_checkpoint(o.checkpoint_dir);
  if (o.ema && c.ema.empty())
    throw CheckpointError(fmt::format("{}: --ema requested but the checkpoint has no EMA weights", o.checkpoint_dir));
  const NamedTensors& source = o.ema ? c.ema : c.model;
  const std::vector<std::string> parts = exported_parts(parse_config(c.config_yaml, o.checkpoint_dir + "/config").model);
  if (parts.size() > 1 && o.text_encoder_out.empty())
    throw CheckpointError(fmt::format("{}: the model has a built-in text encoder; name its file with --text-encoder-out "
                                      "(--out gets the transformer with the reference key names)",
                                      o.checkpoint_dir));
  if (parts.size() == 1 && !o.text_encoder_out.empty())
    throw CheckpointError(fmt::format("{}: --text-encoder-out given but the model has no built-in text encoder",
                                      o.checkpoint_dir));
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"source_checkpoint", o.checkpoint_dir},
                                                       {"weights", o.ema ? "ema" : "raw"},
                                                       {"step", std::to_string(c.progress.step)},
                                                       {"flowtrain_config", c.config_yaml}};
  std::vector<std::string> first_names;
  for (size_t p = 0; p < parts.size(); ++p) {
    const std::string& prefix = parts[p];
    NamedTensors out;
    for (const auto& [name, t] : source) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      out.emplace_back(name.substr(prefix.size()), o.dtype == "bf16" ? t.to(at::kBFloat16) : t.to(at::kFloat));
      if (p == 0) first_names.push_back(out.back().first);
    }
    data::write_safetensors(p == 0 ? o.out_path : o.text_encoder_out, out, metadata);
  }
  return first_names;
}

}  // namespace flowtrain::trainer
