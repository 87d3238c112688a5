// The one linear layer of every diffusion model here: y = x·Wᵀ + b, with a compute backend that
// can be swapped per layer (fp8 training, models/fp8/) without touching the model files.
//
// Parameters and their names are torch.nn.Linear's (`weight` [out, in], `bias` [out]), so the
// reference checkpoints' keys load unchanged whatever the backend; the weights stay fp32 master
// copies — a backend only changes how the product is computed.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <ostream>
#include <string>

namespace flowtrain::models {

// A weight handed to a backend already cast (FSDP's fp8 all-gather, parallel/fsdp.h): the gathered
// fp8 data [out, in] and the 0-dim fp32 inverse scale that dequantises it (W ≈ data · inv_scale).
// The owner of the gathered storage sets `data` when the gather lands and resets it when the
// storage is released; a backend given such a slot never reads its weight parameter's own data
// (it has none: only the parameter's shape, dtype and gradient are used).
struct PrecastWeight {
  at::Tensor data, inv_scale;
};

// How a Linear computes its product. Implementations must be differentiable in x, weight and
// bias (autograd), return the dtype at::linear would (the input's, or the autocast dtype), and
// may keep state across calls (delayed scaling's amax history).
class LinearCompute {
 public:
  virtual ~LinearCompute() = default;
  virtual at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) = 0;
  virtual std::string describe() const = 0;  // "fp8 tensorwise (emulated)"
};

class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = true);
  // Registers weight/bias and initialises them as torch.nn.Linear does (kaiming_uniform(a = √5),
  // bias U(±1/√in)), drawing from the global generator in the same order.
  void reset() override;
  // Without a backend: at::linear, as torch.nn.functional.linear — tokens [B, N, in] flatten into
  // one addmm with the bias (torch::nn::Linear's C++ forward instead does a matmul and a separate
  // bias add for inputs of more than 2 dims: an extra pass over the output, and a reduction for ∂b).
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  // nullptr = the default at::linear path.
  void set_compute(std::shared_ptr<LinearCompute> compute) { compute_ = std::move(compute); }
  LinearCompute* compute() const { return compute_.get(); }

  int64_t in_features, out_features;
  bool with_bias;
  at::Tensor weight, bias;

 private:
  std::shared_ptr<LinearCompute> compute_;
};
TORCH_MODULE(Linear);

}  // namespace flowtrain::models
