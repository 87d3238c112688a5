#include "trainer/eval/checkpoint_model.h"

#include "trainer/checkpoint/checkpoint.h"

#include <filesystem>

namespace flowtrain::trainer {

CheckpointModel load_checkpoint_model(const Config& config, const std::string& checkpoint_dir, bool raw,
                                      const c10::Device& device) {
  const FamilySpec& family = model_family(config.model.arch);
  CheckpointModel out;
  out.conditioning = run_conditioning(config, nullptr);
  const CheckpointContents checkpoint = load_checkpoint(checkpoint_dir);
  out.model = family.build(config.model);
  out.ema = !raw && !checkpoint.ema.empty();
  out.step = checkpoint.progress.step;
  out.report_path = (std::filesystem::path(checkpoint_dir) / (raw ? "eval-raw.json" : "eval.json")).string();
  const std::string source =
      (std::filesystem::path(checkpoint_dir) / (out.ema ? "ema.safetensors" : "model.safetensors")).string();
  load_state_dict(*out.model, out.ema ? checkpoint.ema : checkpoint.model, source);
  out.model->to(device);
  out.model->eval();
  return out;
}

}  // namespace flowtrain::trainer
