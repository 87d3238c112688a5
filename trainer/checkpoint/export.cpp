#include "trainer/checkpoint/export.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/checkpoint.h"

#include <fmt/format.h>

namespace flowtrain::trainer {

std::vector<std::string> export_checkpoint(const ExportOptions& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw std::invalid_argument(fmt::format("--dtype must be fp32 or bf16, got '{}'", o.dtype));
  CheckpointContents c = load_checkpoint(o.checkpoint_dir);
  if (o.ema && c.ema.empty())
    throw CheckpointError(fmt::format("{}: --ema requested but the checkpoint has no EMA weights", o.checkpoint_dir));
  const NamedTensors& source = o.ema ? c.ema : c.model;
  NamedTensors out;
  std::vector<std::string> names;
  for (const auto& [name, t] : source) {
    out.emplace_back(name, o.dtype == "bf16" ? t.to(at::kBFloat16) : t.to(at::kFloat));
    names.push_back(name);
  }
  data::write_safetensors(o.out_path, out,
                          {{"format", "pt"},
                           {"source_checkpoint", o.checkpoint_dir},
                           {"weights", o.ema ? "ema" : "raw"},
                           {"step", std::to_string(c.progress.step)},
                           {"flowtrain_config", c.config_yaml}});
  return names;
}

}  // namespace flowtrain::trainer
