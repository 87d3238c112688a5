#include "trainer/frozen/frozen_sampling.h"

#include "trainer/builders.h"
#include "trainer/frozen/frozen_encoders.h"
#include "trainer/frozen/frozen_models.h"


namespace flowtrain::trainer {

bool has_frozen_text_encoders(const ModelConfig& model) {
  return !model.t5_encoder.empty() && !model.clip_encoder.empty();
}

models::Conditioning frozen_prompt_conditioning(const Config& config, const std::vector<std::string>& prompts) {
  ModelConfig text_only = config.model;
  text_only.autoencoder.clear();  // prompts need the text encoders only
  const FrozenEncoders::Text text = shared_frozen_encoders(text_only, select_device(config.run)).encode_text(prompts);
  models::Conditioning cond;
  cond.set("txt", text.txt.cpu());
  cond.set("vec", text.vec.cpu());
  cond.set("txt_mask", text.txt_mask.cpu());
  return cond;
}

bool decodes_samples(const Config& config) { return !config.model.autoencoder.empty(); }

at::Tensor samples_to_pixels(const Config& config, const at::Tensor& samples) {
  if (!decodes_samples(config)) return samples;
  ModelConfig decoder_only;
  decoder_only.autoencoder = config.model.autoencoder;
  return shared_frozen_encoders(decoder_only, select_device(config.run)).decode_latents(samples).cpu();
}

std::vector<int64_t> pixel_sample_shape(const Config& config, std::vector<int64_t> shape) {
  if (!decodes_samples(config)) return shape;
  const models::AutoencoderOptions ae = autoencoder_options_of_file(config.model.autoencoder);
  shape[0] = ae.out_channels;
  for (size_t d = shape.size() - 2; d < shape.size(); ++d) shape[d] *= ae.downscale();
  return shape;
}

at::Tensor pixels_to_model_space(const Config& config, const at::Tensor& pixels) {
  if (!decodes_samples(config)) return pixels;
  ModelConfig encoder_only;
  encoder_only.autoencoder = config.model.autoencoder;
  return shared_frozen_encoders(encoder_only, select_device(config.run)).encode_images(pixels).cpu();
}

}  // namespace flowtrain::trainer
