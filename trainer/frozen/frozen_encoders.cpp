#include "trainer/frozen/frozen_encoders.h"

#include "data/data_error.h"
#include "trainer/frozen/frozen_models.h"

#include <ATen/core/grad_mode.h>

namespace flowtrain::trainer {

FrozenEncoders::FrozenEncoders(const ModelConfig& model, at::Device device, at::ScalarType dtype)
    : device_(device), dtype_(dtype), t5_max_length_(model.t5_max_length) {
  if (!model.autoencoder.empty()) autoencoder_ = load_autoencoder(model.autoencoder, device, dtype);
  if (!model.t5_encoder.empty()) {
    t5_ = load_t5(model.t5_encoder, device, dtype);
    t5_tokenizer_.emplace(model.t5_tokenizer);
  }
  if (!model.clip_encoder.empty()) {
    clip_ = load_clip(model.clip_encoder, device, dtype);
    clip_tokenizer_.emplace(model.clip_tokenizer);
  }
}

const models::AutoencoderOptions& FrozenEncoders::autoencoder_options() const {
  if (!autoencoder_) throw data::DataError("no autoencoder: set model.autoencoder (ae.safetensors)");
  return (*autoencoder_)->options;
}

int64_t FrozenEncoders::downsampling() const { return int64_t{1} << (autoencoder_options().levels() - 1); }

at::Tensor FrozenEncoders::encode_images(const at::Tensor& images) {
  autoencoder_options();  // throws without one
  at::NoGradGuard no_grad;
  return (*autoencoder_)->encode(images.to(device_, dtype_)).to(at::kCPU, at::kFloat);
}

at::Tensor FrozenEncoders::decode_latents(const at::Tensor& latents) {
  autoencoder_options();
  at::NoGradGuard no_grad;
  return (*autoencoder_)->decode(latents.to(device_, dtype_)).to(at::kCPU, at::kFloat);
}

FrozenEncoders::Text FrozenEncoders::encode_text(const std::vector<std::string>& captions) {
  if (!has_text_encoders())
    throw data::DataError("FLUX's text conditioning needs both model.text_encoders.t5 and model.text_encoders.clip");
  at::NoGradGuard no_grad;
  const data::T5Tokenizer::Batch t5_ids = t5_tokenizer_->encode_batch(captions, t5_max_length_);
  const int64_t clip_length = (*clip_)->options.max_positions;
  const data::ClipTokenizer::Batch clip_ids = clip_tokenizer_->encode_batch(captions, clip_length);
  Text text;
  text.txt = (*t5_)->forward(t5_ids.ids.to(device_)).to(at::kCPU, at::kFloat);
  text.txt_mask = t5_ids.mask;
  text.vec = (*clip_)->forward(clip_ids.ids.to(device_)).pooled.to(at::kCPU, at::kFloat);
  text.truncated = t5_ids.truncated;
  return text;
}

}  // namespace flowtrain::trainer
