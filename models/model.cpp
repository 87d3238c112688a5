#include "models/model.h"

namespace flowtrain::models {

Tensors run_sublayer(const SublayerFn& run, Sublayer part, const UnitCall& call, const Tensors& inputs) {
  return run ? run(part, call, inputs) : call(inputs);
}

SublayerFn sublayer_fn(const DiffusionModel& model, int64_t index) {
  if (!model.sublayer_runner) return {};
  return [runner = model.sublayer_runner, index](Sublayer part, const UnitCall& call, const Tensors& inputs) {
    return runner(index, part, call, inputs);
  };
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace flowtrain::models
