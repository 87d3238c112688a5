#include "models/text/text_to_image.h"

#include <fmt/format.h>

namespace flowtrain::models {

TextToImageImpl::TextToImageImpl(TextEncoder encoder, std::shared_ptr<DiffusionModel> inner, double dropout)
    : text_dropout(dropout) {
  // Registration order: the encoder first, as it runs first.
  text_encoder = register_module("text_encoder", std::move(encoder));
  transformer = register_module("transformer", std::move(inner));
}

Conditioning TextToImageImpl::encode(const Conditioning& cond) {
  const auto out = text_encoder->forward(cond.at("tokens"), cond.at("txt_mask"));
  Conditioning inner;
  for (const auto& [name, tensor] : cond.tensors())
    if (name != "tokens") inner.set(name, tensor);
  inner.set("txt", out.txt);
  inner.set("vec", out.vec);
  return inner;
}

at::Tensor TextToImageImpl::forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) {
  // What the runtime injected into this model applies to the transformer's blocks.
  transformer->unit_runner = unit_runner;
  transformer->sublayer_runner = sublayer_runner;
  transformer->sequence_split = sequence_split;
  return transformer->forward(x, t, encode(cond));
}

double TextToImageImpl::train_flops_per_sample() const {
  return transformer->train_flops_per_sample() + 3.0 * text_encoder_forward_flops_per_sample(text_encoder->options);
}

std::string TextToImageImpl::describe() const {
  const auto& o = text_encoder->options;
  return fmt::format("{}, text encoder {} layers width {} over {} tokens (vocabulary {})", transformer->describe(),
                     o.depth, o.width, o.length, o.vocab_size);
}

ConditioningDropout TextToImageImpl::conditioning_dropout() const {
  ConditioningDropout d;
  if (text_dropout > 0) d.probabilities = {text_dropout};
  d.apply = [](const Conditioning& cond, const std::vector<at::Tensor>& dropped) {
    if (dropped.empty()) return cond;
    Conditioning out = cond;
    const at::Tensor& mask = cond.at("txt_mask");
    out.set("txt_mask", at::logical_and(mask, at::logical_not(dropped[0].to(mask.device())).unsqueeze(1)));
    return out;
  };
  return d;
}

Conditioning TextToImageImpl::null_conditioning(const Conditioning& cond) const {
  Conditioning out = cond;
  out.set("txt_mask", at::zeros_like(cond.at("txt_mask")));
  return out;
}

UnitPlan TextToImageImpl::units() const {
  const UnitPlan inner = transformer->units();
  UnitPlan plan;
  plan.stem = {"text_encoder"};
  for (const auto& s : inner.stem) plan.stem.push_back("transformer." + s);
  for (const auto& b : inner.blocks) plan.blocks.push_back("transformer." + b);
  for (const auto& h : inner.head) plan.head.push_back("transformer." + h);
  return plan;
}

}  // namespace flowtrain::models
