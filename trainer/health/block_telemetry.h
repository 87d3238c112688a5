// Per-block gradient norms and update/weight ratios every health.telemetry_every steps, for
// silent-drift forensics: a block whose gradients vanish or whose weights move 100× faster than
// the others shows up here long before the loss says anything. Blocks are named by parameter
// prefix (blocks.3, double_blocks.0, single_blocks.7; the rest by their top-level module:
// x_embedder, t_embedder, final_layer, …). Gradient norms are taken after the global clip (which
// scales every block alike), update ratios over the whole AdamW step. Batched: one host read per quantity, a collective under FSDP.
#pragma once

#include "trainer/train_state.h"

#include <map>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// "double_blocks.0.img_attn.qkv.weight" → "double_blocks.0"; "t_embedder.mlp.0.weight" → "t_embedder".
std::string block_of(const std::string& parameter_name);

// Sums per-parameter squared norms by block.
std::map<std::string, double> block_sq_norms(const std::vector<std::pair<std::string, double>>& per_parameter);

class BlockTelemetry {
 public:
  explicit BlockTelemetry(int64_t every) : every_(every) {}
  bool due(int64_t step) const { return every_ > 0 && step % every_ == 0; }
  // Before the optimizer step (gradients present): gradient norms, and a copy of the weights.
  void before_update(TrainState& state);
  // After it: metrics "grad_norm/<block>" and "update_ratio/<block>" (‖Δw‖ / ‖w‖).
  std::map<std::string, double> after_update(TrainState& state);

 private:
  int64_t every_;
  std::map<std::string, double> grad_sq_;
  std::vector<at::Tensor> before_;
};

}  // namespace flowtrain::trainer
