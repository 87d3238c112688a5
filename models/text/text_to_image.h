// A text-to-image model with its own text encoder: the encoder reads the batch's tokens and the
// transformer it wraps (Flux) is conditioned on the encoder's outputs, both trained together.
//
//   cond {"tokens" int64 [B, L], "txt_mask" bool [B, L]} ─ text_encoder ─▶ {"txt", "vec"} ─▶ transformer
//
// Classifier-free guidance: a dropped caption is a row whose mask is all false, which the encoder
// turns into zeros (SD3's null input); the empty prompt is therefore the unconditional one. One
// dropout probability: there is one encoder (SD3 drops each of its encoders independently; the
// precomputed path, Flux alone, drops "txt" and "vec" independently).
#pragma once

#include "models/model.h"
#include "models/text/text_encoder.h"

#include <memory>

namespace flowtrain::models {

class TextToImageImpl : public DiffusionModel {
 public:
  TextToImageImpl(TextEncoder text_encoder, std::shared_ptr<DiffusionModel> transformer, double text_dropout);

  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) override;
  // The transformer's conditioning for `cond`: the encoder's txt and vec in place of the tokens.
  Conditioning encode(const Conditioning& cond);

  std::vector<int64_t> sample_shape() const override { return transformer->sample_shape(); }
  int64_t tokens_per_sample() const override { return transformer->tokens_per_sample(); }
  std::string token_layout() const override { return transformer->token_layout(); }
  std::vector<int64_t> token_streams() const override { return transformer->token_streams(); }
  int64_t attention_heads() const override { return transformer->attention_heads(); }
  double train_flops_per_sample() const override;
  std::string describe() const override;
  ConditioningDropout conditioning_dropout() const override;
  Conditioning null_conditioning(const Conditioning& cond) const override;  // every mask false
  // The encoder is part of the stem (it runs first, on every rank whole: text is short); the
  // transformer's units follow under their prefix.
  UnitPlan units() const override;
  void set_attention(const AttentionFn& attention) override { transformer->set_attention(attention); }

  // The module-name prefixes of the two parts (`flowtrain export` writes each as a file of its
  // own with the prefix removed, so the transformer's keys are the reference's).
  static constexpr const char* kTransformerPrefix = "transformer.";
  static constexpr const char* kTextEncoderPrefix = "text_encoder.";

  TextEncoder text_encoder{nullptr};
  std::shared_ptr<DiffusionModel> transformer;
  double text_dropout;
};

}  // namespace flowtrain::models
