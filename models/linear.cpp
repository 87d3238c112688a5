#include "models/linear.h"

#include <torch/nn/init.h>

#include <cmath>

namespace flowtrain::models {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : in_features(in_features), out_features(out_features), with_bias(with_bias) {
  reset();
}

void LinearImpl::reset() {
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  bias = register_parameter("bias", with_bias ? at::empty({out_features}) : at::Tensor(), /*requires_grad=*/with_bias);
  at::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (with_bias) {
    const double bound = 1.0 / std::sqrt(double(in_features));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  return compute_ ? compute_->linear(x, weight, bias) : at::linear(x, weight, bias);
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "flowtrain::models::Linear(in_features=" << in_features << ", out_features=" << out_features
         << ", bias=" << (with_bias ? "true" : "false");
  if (compute_) stream << ", compute=" << compute_->describe();
  stream << ")";
}

}  // namespace flowtrain::models
