#include "trainer/frozen/online_encoding.h"

#include "trainer/family.h"
#include "trainer/frozen/frozen_encoders.h"
#include "trainer/frozen/frozen_models.h"
#include "trainer/frozen/frozen_sampling.h"

#include "data/loader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include <filesystem>

namespace flowtrain::trainer {

namespace fs = std::filesystem;

namespace {

// The token fields of the online text path: FrozenTokenizers::Tokens by name.
constexpr const char* kT5Ids = "t5_ids";
constexpr const char* kT5Mask = "t5_mask";
constexpr const char* kClipIds = "clip_ids";

bool reads_text_embeddings(const ModelConfig& model) {
  const FamilySpec& family = model_family(model.arch);
  return static_cast<bool>(family.text_conditioning) && !reads_caption_tokens(model);
}

}  // namespace

bool encodes_images_online(const Config& c) {
  return !c.model.autoencoder.empty() && c.data.image_member == ImageMember::image;
}

bool encodes_images_in_step(const Config& c) {
  return encodes_images_online(c) && (c.data.source == DataSource::shards || c.data.source == DataSource::synthetic);
}

bool encodes_dataset_once(const Config& c) { return encodes_images_online(c) && !encodes_images_in_step(c); }

bool encodes_text_online(const Config& c) { return c.data.text_member == TextMember::caption; }

DataInput data_input(const Config& c) {
  if (!encodes_images_online(c)) return {c.model.in_channels, c.model.image_size, 1};
  const models::AutoencoderOptions ae = autoencoder_options_of_file(c.model.autoencoder);
  return {ae.in_channels, c.model.image_size * ae.downscale(), ae.downscale()};
}

void check_frozen_inputs(const Config& c) {
  const ModelConfig& m = c.model;
  if (!m.autoencoder.empty()) {
    const models::AutoencoderOptions ae = autoencoder_options_of_file(m.autoencoder);
    if (m.in_channels != ae.z_channels)
      throw ConfigError(fmt::format("'model.in_channels' is {} but the autoencoder {} has {} latent channels "
                                    "(z_channels): the model trains on its latents",
                                    m.in_channels, m.autoencoder, ae.z_channels));
    if (c.data.video_frames > 0 && c.data.image_member == ImageMember::image)
      throw ConfigError(fmt::format("'model.autoencoder' {} encodes images; video clips (data.video.frames {}) "
                                    "are not encoded through it",
                                    m.autoencoder, c.data.video_frames));
  }
  if (!encodes_text_online(c)) return;
  if (!reads_text_embeddings(m))
    throw ConfigError(fmt::format("'data.text_member' is caption, encoded by model.text_encoders for a model on text "
                                  "embeddings; model.arch {} {}",
                                  m.arch,
                                  model_family(m.arch).text_conditioning
                                      ? "reads captions through its own text encoder (model.text_encoder_layers > 0)"
                                      : "is class-conditional"));
  if (!has_frozen_text_encoders(m))
    throw ConfigError("'data.text_member' is caption: set model.text_encoders.t5 and model.text_encoders.clip (and "
                      "their tokenizers) to encode the captions in the step");
  const TextConditioning text = text_conditioning(m);
  const models::T5Options t5 = t5_options_of_config((fs::path(m.t5_encoder) / "config.json").string());
  const models::ClipTextOptions clip = clip_options_of_config((fs::path(m.clip_encoder) / "config.json").string());
  if (text.width != t5.d_model)
    throw ConfigError(fmt::format("'model.context_dim' is {} but the T5 encoder {} gives {}-wide states (d_model)",
                                  text.width, m.t5_encoder, t5.d_model));
  if (text.pooled_width != clip.hidden)
    throw ConfigError(fmt::format("'model.vec_dim' is {} but the CLIP encoder {} pools to {} (hidden_size)",
                                  text.pooled_width, m.clip_encoder, clip.hidden));
  if (text.length != m.t5_max_length)
    throw ConfigError(fmt::format("'model.text_len' is {} but model.text_encoders.t5_max_length is {}: the model "
                                  "reads T5's padded states",
                                  text.length, m.t5_max_length));
}

std::function<std::map<std::string, at::Tensor>(const std::vector<std::string>&)> frozen_caption_tokens(
    const Config& c) {
  auto tokenizers = std::make_shared<const FrozenTokenizers>(c.model);
  return [tokenizers](const std::vector<std::string>& captions) {
    const FrozenTokenizers::Tokens tokens = tokenizers->tokenize(captions);
    return std::map<std::string, at::Tensor>{{kT5Ids, tokens.t5_ids}, {kT5Mask, tokens.t5_mask}, {kClipIds, tokens.clip_ids}};
  };
}

std::shared_ptr<const data::ImageDataset> encode_dataset_once(const Config& c,
                                                              std::shared_ptr<const data::ImageDataset> dataset,
                                                              const c10::Device& device) {
  ModelConfig files = c.model;  // the autoencoder alone
  files.t5_encoder.clear(), files.t5_tokenizer.clear(), files.clip_encoder.clear(), files.clip_tokenizer.clear();
  FrozenEncoders& encoders = shared_frozen_encoders(files, device);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = dataset->size();
  constexpr int64_t kBatch = 128;  // images per encoder call: a few hundred MB of activations at 56² on the CPU
  const int64_t side = data_input(c).image_size;  // reads the autoencoder file's header: once
  std::vector<at::Tensor> latents;
  auto last_report = t0;
  for (int64_t from = 0; from < n; from += kBatch) {
    const at::Tensor pixels =
        data::model_input_images(dataset->images.narrow(0, from, std::min(kBatch, n - from)), side);
    latents.push_back(encoders.encode_images(pixels).cpu());
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - t0).count();
    if (std::chrono::duration<double>(now - last_report).count() >= 10.0 && from + kBatch < n) {
      const double done = static_cast<double>(from + kBatch) / static_cast<double>(n);
      spdlog::info("data: encoding the training images through {}: {:.0f}%, ETA {:.0f} s", c.model.autoencoder,
                   100.0 * done, elapsed / done - elapsed);
      last_report = now;
    }
  }
  auto encoded = std::make_shared<data::ImageDataset>(*dataset);
  encoded->images = at::cat(latents);
  spdlog::info("data: encoded the {} training images once through {} to latents [{}] in {:.1f} s", n,
               c.model.autoencoder, fmt::join(encoded->images.sizes().slice(1), ", "),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return encoded;
}

std::unique_ptr<OnlineEncoder> OnlineEncoder::for_run(const Config& c, const c10::Device& device) {
  const bool images = encodes_images_in_step(c), text = encodes_text_online(c);
  if (!images && !text) return nullptr;
  ModelConfig files = c.model;  // only what the step runs is loaded
  if (!images) files.autoencoder.clear();
  if (!text) files.t5_encoder.clear(), files.t5_tokenizer.clear(), files.clip_encoder.clear(), files.clip_tokenizer.clear();
  return std::unique_ptr<OnlineEncoder>(new OnlineEncoder(shared_frozen_encoders(files, device), images, text));
}

void OnlineEncoder::encode(data::Batch& batch) {
  if (images_) batch.images = encoders_.encode_images(batch.images);
  if (text_) {
    FrozenTokenizers::Tokens tokens;
    tokens.t5_ids = batch.fields.at(kT5Ids);
    tokens.t5_mask = batch.fields.at(kT5Mask);
    tokens.clip_ids = batch.fields.at(kClipIds);
    FrozenEncoders::Text text = encoders_.encode_tokens(tokens);
    for (const char* name : {kT5Ids, kT5Mask, kClipIds}) batch.fields.erase(name);
    batch.fields["txt"] = std::move(text.txt);
    batch.fields["txt_mask"] = std::move(text.txt_mask);
    batch.fields["vec"] = std::move(text.vec);
  }
}

}  // namespace flowtrain::trainer
