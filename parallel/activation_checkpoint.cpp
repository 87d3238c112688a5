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
  BlockForward call;
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
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& c,
                            c10::intrusive_ptr<Recompute> recompute) {
    // Autograd Functions run their forward with grad mode off: call() records no graph and keeps
    // no activations.
    recompute->cpu_rng = generator_state(at::detail::getDefaultCPUGenerator());
    recompute->device = x.device();
    recompute->autocast = at::autocast::is_autocast_enabled(x.device().type());
    recompute->autocast_dtype = at::autocast::get_autocast_dtype(x.device().type());
    if (x.device().is_cuda()) recompute->device_rng = generator_state(at::globalContext().defaultGenerator(x.device()));
    ctx->save_for_backward({x, c});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return recompute->call(x, c);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_USER_SCOPE("activation_checkpoint.recompute");
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    at::Tensor x = saved[0].detach().requires_grad_(saved[0].requires_grad());
    at::Tensor c = saved[1].detach().requires_grad_(saved[1].requires_grad());
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
    at::Tensor out;
    {
      at::AutoGradMode grad_on(true);
      // The first forward's autocast (backward runs after the trainer's region has closed).
      models::AutocastRegion autocast(recompute->autocast, recompute->device.type(), recompute->autocast_dtype);
      out = recompute->call(x, c);
    }
    set_generator_state(cpu, cpu_now);
    if (device_gen.defined()) set_generator_state(device_gen, device_now);
    // Backward through the recomputed graph: parameters accumulate their gradients as usual,
    // the inputs' gradients are returned to the outer graph.
    if (out.requires_grad()) torch::autograd::backward({out}, {grads[0]}, /*retain_graph=*/false);
    return {x.requires_grad() ? x.grad() : at::Tensor(), c.requires_grad() ? c.grad() : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpointed_call(BlockForward call, const at::Tensor& x, const at::Tensor& c) {
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->call = std::move(call);
  return CheckpointFn::apply(x, c, recompute);
}

bool checkpoint_block(const std::string& mode, int64_t every, int64_t block_index) {
  if (mode == "none") return false;
  TORCH_CHECK(mode == "full", "activation checkpointing mode must be none | full, got ", mode);
  return every > 0 && block_index % every == 0;
}

}  // namespace flowtrain::parallel
