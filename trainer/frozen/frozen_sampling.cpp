#include "trainer/frozen/frozen_sampling.h"

#include "trainer/builders.h"
#include "trainer/frozen/frozen_encoders.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace flowtrain::trainer {
namespace {

// One FrozenEncoders per (the files it was built from): a run samples many times.
FrozenEncoders& encoders_for(const ModelConfig& model, const c10::Device& device) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, std::string, int64_t, std::string>, std::unique_ptr<FrozenEncoders>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{model.autoencoder, model.t5_encoder, model.clip_encoder, model.t5_max_length, device.str()}];
  if (!slot) slot = std::make_unique<FrozenEncoders>(model, device, device.is_cuda() ? at::kBFloat16 : at::kFloat);
  return *slot;
}

}  // namespace

bool has_frozen_text_encoders(const ModelConfig& model) {
  return !model.t5_encoder.empty() && !model.clip_encoder.empty();
}

models::Conditioning frozen_prompt_conditioning(const Config& config, const std::vector<std::string>& prompts) {
  ModelConfig text_only = config.model;
  text_only.autoencoder.clear();  // prompts need the text encoders only
  const FrozenEncoders::Text text =
      encoders_for(text_only, select_device(config.run)).encode_text(prompts);
  models::Conditioning cond;
  cond.set("txt", text.txt);
  cond.set("vec", text.vec);
  cond.set("txt_mask", text.txt_mask);
  return cond;
}

bool decodes_samples(const Config& config) {
  return !config.model.autoencoder.empty() && config.data.image_member == ImageMember::latent;
}

at::Tensor samples_to_pixels(const Config& config, const at::Tensor& samples) {
  if (!decodes_samples(config)) return samples;
  ModelConfig decoder_only;
  decoder_only.autoencoder = config.model.autoencoder;
  return encoders_for(decoder_only, select_device(config.run)).decode_latents(samples);
}

}  // namespace flowtrain::trainer
