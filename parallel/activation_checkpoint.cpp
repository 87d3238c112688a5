#include "parallel/activation_checkpoint.h"

#include "models/autocast_region.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <mutex>
#include <string>

namespace flowtrain::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the recompute needs besides the inputs, kept alive by the autograd node (IValue capsule).
struct Recompute : torch::CustomClassHolder {
  models::UnitCall call;
  at::Tensor cpu_rng, device_rng;  // generator states at the first forward
  c10::Device device{c10::kCPU};
  bool autocast = false;            // autocast of the inputs' device type at the first forward
  at::ScalarType autocast_dtype = at::kBFloat16;
};

at::Tensor generator_state(at::Generator gen) {  // a handle: copies share the generator
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_generator_state(at::Generator& gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct CheckpointFn : torch::autograd::Function<CheckpointFn> {
  // `inputs` as a TensorList: autograd tracks every tensor of it as an input of this node.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Recompute> recompute) {
    // Autograd Functions run their forward with grad mode off: call() records no graph and keeps
    // no activations.
    const c10::Device device = inputs.front().device();
    recompute->cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
    recompute->device = device;
    recompute->autocast = at::autocast::is_autocast_enabled(device.type());
    recompute->autocast_dtype = at::autocast::get_autocast_dtype(device.type());
    if (device.is_cuda()) recompute->device_rng = generator_state(at::globalContext().defaultGenerator(device));
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return recompute->call(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("activation_checkpoint.recompute");
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    models::Tensors inputs;
    for (const auto& saved : ctx->get_saved_variables())
      inputs.push_back(saved.detach().requires_grad_(saved.requires_grad()));
    // The recompute draws what the first forward drew; the generators continue from where the
    // backward found them afterwards.
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    const at::Tensor cpu_now = generator_state(cpu);
    set_generator_state(cpu, recompute->cpu_rng);
    at::Generator device_gen;
    at::Tensor device_now;
    if (recompute->device.is_cuda()) {
      device_gen = at::globalContext().defaultGenerator(recompute->device);
      device_now = generator_state(device_gen);
      set_generator_state(device_gen, recompute->device_rng);
    }
    models::Tensors outputs;
    {
      at::AutoGradMode grad_on(true);
      // The first forward's autocast (backward runs after the trainer's region has closed).
      models::AutocastRegion autocast(recompute->autocast, recompute->device.type(), recompute->autocast_dtype);
      outputs = recompute->call(inputs);
    }
    set_generator_state(cpu, cpu_now);
    if (device_gen.defined()) set_generator_state(device_gen, device_now);
    // Backward through the recomputed graph: parameters accumulate their gradients as usual,
    // the inputs' gradients are returned to the outer graph.
    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads, /*retain_graph=*/false);
    variable_list input_grads;
    for (const auto& x : inputs) input_grads.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    input_grads.emplace_back();  // the capsule
    return input_grads;
  }
};

}  // namespace

models::Tensors checkpointed_call(models::UnitCall call, const models::Tensors& inputs) {
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->call = std::move(call);
  return CheckpointFn::apply(at::TensorList(inputs), recompute);
}

namespace {
bool every_th(int64_t every, int64_t block_index) { return every > 0 && block_index % every == 0; }
}  // namespace

bool checkpoint_block(RecomputePolicy policy, int64_t every, int64_t block_index) {
  return policy == RecomputePolicy::full && every_th(every, block_index);
}

bool checkpoint_sublayer(RecomputePolicy policy, int64_t every, int64_t block_index, models::Sublayer part) {
  const bool wanted = (policy == RecomputePolicy::attention && part == models::Sublayer::Attention) ||
                      (policy == RecomputePolicy::mlp && part == models::Sublayer::Mlp);
  return wanted && every_th(every, block_index);
}

}  // namespace flowtrain::parallel
