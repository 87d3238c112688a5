#include "models/classifier.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace flowtrain::models {

namespace {

// Runs `build` and then puts the global CPU generator back in its previous state: LibTorch's
// module constructors draw their default initialisation from it.
template <typename F>
void preserving_global_generator(F&& build) {
  at::Generator global = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(global.mutex());
    state = global.get_state();
  }
  build();
  std::lock_guard<std::mutex> lock(global.mutex());
  global.set_state(state);
}

torch::nn::Conv2d conv3x3(int64_t in, int64_t out) {
  // No bias: the batch norm that follows has its own shift.
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false));
}

at::Tensor block(const at::Tensor& x, torch::nn::Conv2d& conv, torch::nn::BatchNorm2d& bn) {
  return at::max_pool2d(at::relu(bn->forward(conv->forward(x))), {2, 2});
}

}  // namespace

FashionClassifierImpl::FashionClassifierImpl(uint64_t seed) {
  preserving_global_generator([&] {
    conv1 = register_module("conv1", conv3x3(1, 32));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(32));
    conv2 = register_module("conv2", conv3x3(32, 64));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(64));
    conv3 = register_module("conv3", conv3x3(64, 128));
    bn3 = register_module("bn3", torch::nn::BatchNorm2d(128));
    fc1 = register_module("fc1", torch::nn::Linear(128 * 3 * 3, kFeatureDim));
    fc2 = register_module("fc2", torch::nn::Linear(kFeatureDim, kNumClasses));
  });
  reset_parameters(seed);
}

void FashionClassifierImpl::reset_parameters(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  // PyTorch's default for Conv/Linear (kaiming_uniform with a = √5): U(±1/√fan_in) for the weight
  // and the bias. Batch norm starts as the identity (weight 1, bias 0, running stats 0/1).
  auto init = [&](const at::Tensor& weight, const at::Tensor& bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(weight[0].numel()));
    weight.copy_(at::empty(weight.sizes(), weight.options().device(at::kCPU)).uniform_(-bound, bound, gen));
    if (bias.defined())
      bias.copy_(at::empty(bias.sizes(), bias.options().device(at::kCPU)).uniform_(-bound, bound, gen));
  };
  init(conv1->weight, conv1->bias);
  init(conv2->weight, conv2->bias);
  init(conv3->weight, conv3->bias);
  init(fc1->weight, fc1->bias);
  init(fc2->weight, fc2->bias);
  for (auto* bn : {&bn1, &bn2, &bn3}) (*bn)->reset_parameters();  // constants: no generator
}

at::Tensor FashionClassifierImpl::features(const at::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 1 || x.size(2) != x.size(3) || x.size(2) < kImageSide)
    throw std::invalid_argument(fmt::format("FashionClassifier: input must be [B, 1, S, S] with S >= {}, got [{}]",
                                            kImageSide, fmt::join(x.sizes(), ", ")));
  at::Tensor h = x;
  if (x.size(2) > kImageSide) {
    const int64_t before = (x.size(2) - kImageSide) / 2;  // the loader pads (S − 28) / 2 before
    h = x.slice(2, before, before + kImageSide).slice(3, before, before + kImageSide);
  }
  h = block(h, conv1, bn1);  // [B, 32, 14, 14]
  h = block(h, conv2, bn2);  // [B, 64, 7, 7]
  h = block(h, conv3, bn3);  // [B, 128, 3, 3]
  return fc1->forward(h.flatten(1));
}

at::Tensor FashionClassifierImpl::head(const at::Tensor& features) { return fc2->forward(at::relu(features)); }

at::Tensor FashionClassifierImpl::forward(const at::Tensor& x) { return head(features(x)); }

at::Tensor classifier_input_from_uint8(const at::Tensor& images) {
  return images.to(at::kFloat).div_(127.5).sub_(1.0);
}

ClassifierOutputs classify_images(FashionClassifier& model, const at::Tensor& images, int64_t batch_size) {
  if (batch_size < 1) throw std::invalid_argument("classify_images: batch_size must be >= 1");
  const c10::Device device = model->parameters().front().device();
  const bool was_training = model->is_training();
  model->eval();
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> features, logits;
  for (int64_t begin = 0; begin < images.size(0); begin += batch_size) {
    at::Tensor x = images.slice(0, begin, std::min(begin + batch_size, images.size(0))).to(device);
    x = x.scalar_type() == at::kByte ? classifier_input_from_uint8(x) : x.to(at::kFloat);
    at::Tensor f = model->features(x);
    features.push_back(f.to(at::kCPU));
    logits.push_back(model->head(f).to(at::kCPU));
  }
  model->train(was_training);
  if (features.empty()) return {at::empty({0, FashionClassifierImpl::kFeatureDim}), at::empty({0, FashionClassifierImpl::kNumClasses})};
  return {at::cat(features), at::cat(logits)};
}

}  // namespace flowtrain::models
