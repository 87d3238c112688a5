#include "trainer/frozen/frozen_encoders.h"

#include "data/data_error.h"
#include "trainer/frozen/frozen_models.h"

#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace flowtrain::trainer {

FrozenTokenizers::FrozenTokenizers(const ModelConfig& model)
    : t5_(model.t5_tokenizer),
      clip_(model.clip_tokenizer),
      t5_max_length_(model.t5_max_length),
      clip_length_(clip_options_of_config((std::filesystem::path(model.clip_encoder) / "config.json").string()).max_positions) {}

FrozenTokenizers::Tokens FrozenTokenizers::tokenize(const std::vector<std::string>& captions) const {
  const data::T5Tokenizer::Batch t5 = t5_.encode_batch(captions, t5_max_length_);
  return {t5.ids, t5.mask, clip_.encode_batch(captions, clip_length_).ids, t5.truncated};
}

namespace {

// Each frozen model is loaded once per process for (its file, device, dtype): the step's encoder,
// the sampling's prompts and its decoder may ask for different subsets of the three, and T5-XXL
// is 9.5 GB in bf16.
template <class Module>
Module loaded_once(const std::string& path, at::Device device, at::ScalarType dtype,
                   Module (*load)(const std::string&, at::Device, at::ScalarType)) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, int>, Module> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(path, device.str(), static_cast<int>(dtype));
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, load(path, device, dtype)).first;
  return it->second;
}

}  // namespace

FrozenEncoders::FrozenEncoders(const ModelConfig& model, at::Device device, at::ScalarType dtype)
    : device_(device), dtype_(dtype) {
  if (!model.autoencoder.empty()) autoencoder_ = loaded_once(model.autoencoder, device, dtype, &load_autoencoder);
  if (!model.t5_encoder.empty()) t5_ = loaded_once(model.t5_encoder, device, dtype, &load_t5);
  if (!model.clip_encoder.empty()) clip_ = loaded_once(model.clip_encoder, device, dtype, &load_clip);
  if (has_text_encoders()) tokenizers_.emplace(model);
}

const models::AutoencoderOptions& FrozenEncoders::autoencoder_options() const {
  if (!autoencoder_) throw data::DataError("no autoencoder: set model.autoencoder (ae.safetensors)");
  return (*autoencoder_)->options;
}

int64_t FrozenEncoders::downsampling() const { return int64_t{1} << (autoencoder_options().levels() - 1); }

at::Tensor FrozenEncoders::encode_images(const at::Tensor& images) {
  autoencoder_options();  // throws without one
  at::NoGradGuard no_grad;
  return (*autoencoder_)->encode(images.to(device_, dtype_)).to(at::kFloat);
}

at::Tensor FrozenEncoders::decode_latents(const at::Tensor& latents) {
  autoencoder_options();
  at::NoGradGuard no_grad;
  return (*autoencoder_)->decode(latents.to(device_, dtype_)).to(at::kFloat);
}

FrozenEncoders::Text FrozenEncoders::encode_text(const std::vector<std::string>& captions) {
  if (!has_text_encoders())
    throw data::DataError("FLUX's text conditioning needs both model.text_encoders.t5 and model.text_encoders.clip");
  return encode_tokens(tokenizers_->tokenize(captions));
}

FrozenEncoders::Text FrozenEncoders::encode_tokens(const FrozenTokenizers::Tokens& tokens) {
  if (!has_text_encoders())
    throw data::DataError("FLUX's text conditioning needs both model.text_encoders.t5 and model.text_encoders.clip");
  at::NoGradGuard no_grad;
  Text text;
  text.txt = (*t5_)->forward(tokens.t5_ids.to(device_)).to(at::kFloat);
  text.txt_mask = tokens.t5_mask.to(device_);
  text.vec = (*clip_)->forward(tokens.clip_ids.to(device_)).pooled.to(at::kFloat);
  text.truncated = tokens.truncated;
  return text;
}

FrozenEncoders& shared_frozen_encoders(const ModelConfig& model, const c10::Device& device) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, std::string, int64_t, std::string>, std::unique_ptr<FrozenEncoders>>
      cache;
  const std::lock_guard<std::mutex> lock(mutex);
  // t5_max_length shapes the tokenizers' output only, which exist with the text encoders.
  const int64_t t5_length = model.t5_encoder.empty() ? 0 : model.t5_max_length;
  auto& slot = cache[{model.autoencoder, model.t5_encoder, model.clip_encoder, t5_length, device.str()}];
  if (!slot) slot = std::make_unique<FrozenEncoders>(model, device, device.is_cuda() ? at::kBFloat16 : at::kFloat);
  return *slot;
}

}  // namespace flowtrain::trainer
