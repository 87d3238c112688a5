// Encoding inside the training step (TorchTitan's Flux mode): the run's data carry pixels and
// captions, and each step turns them into what the model trains on with the frozen FLUX stack.
//   images   model.autoencoder set and data.image_member `image`: the batch's pixels through the
//            autoencoder to scaled latents. The model works in latent cells (model.image_size,
//            model.in_channels = the autoencoder's z_channels, data.buckets in cells); the loader
//            reads images of image_size × f pixels (f: the autoencoder's downsampling).
//            A data set held in memory (data.source fashion_mnist, compositions) is encoded once
//            when the run starts instead: its images never change, so once per image rather than
//            once per image and epoch, and the step runs no frozen model for them. Streamed shards
//            and the synthetic set (a benchmark's stand-in for a stream) are encoded in the step.
//   text     data.text_member `caption` on a model that reads text embeddings: the data workers
//            tokenize each caption for T5 and CLIP ("t5_ids", "t5_mask", "clip_ids"), and the step
//            runs the encoders on the ids to FLUX's "txt", "txt_mask", "vec".
// Everything under no_grad on the run's device (bf16 on CUDA); the step profiles it as the phase
// "frozen_encoders". The precomputed path (`flowtrain data encode`, image_member latent,
// text_member embeddings) gives the same tensors; tests/dist/test_data_encode.cpp holds the
// two to the same losses.
#pragma once

#include "data/batch_source.h"
#include "data/image_dataset.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace flowtrain::trainer {

class FrozenEncoders;

// Pixels in the data, latents for the model (model.autoencoder with data.image_member image):
// encoded either in the step or once at the start (the two below).
bool encodes_images_online(const Config& config);
bool encodes_images_in_step(const Config& config);
bool encodes_dataset_once(const Config& config);
bool encodes_text_online(const Config& config);

// What the data loader reads for the model's input: channels and side in pixels (the model's own
// when nothing is encoded online) and the factor from model cells to pixels (1 without).
struct DataInput {
  int64_t channels = 0;
  int64_t image_size = 0;
  int64_t downsampling = 1;
};
DataInput data_input(const Config& config);

// Throws ConfigError naming the files and keys when the frozen files do not fit the model:
// model.in_channels against the autoencoder's z_channels, context_dim / vec_dim / text_len
// against T5's d_model, CLIP's width and t5_max_length; text_member caption without the text
// encoders or on a model with its own text encoder; the autoencoder with video clips.
void check_frozen_inputs(const Config& config);

// A caption -> the token fields the online text path carries through the loader (one sample's
// rows). The tokenizers are loaded once and shared by the returned function (thread-safe).
std::function<std::map<std::string, at::Tensor>(const std::vector<std::string>& captions)> frozen_caption_tokens(
    const Config& config);

// The in-memory set with its images through the autoencoder (the mean, scaled: what the step
// would compute), in fixed batches on `device`, with progress lines; its other fields as they
// are. Every rank encodes the whole set the same way, so all hold the same latents.
std::shared_ptr<const data::ImageDataset> encode_dataset_once(const Config& config,
                                                              std::shared_ptr<const data::ImageDataset> dataset,
                                                              const c10::Device& device);

class OnlineEncoder {
 public:
  // Null when the run encodes nothing in the step.
  static std::unique_ptr<OnlineEncoder> for_run(const Config& config, const c10::Device& device);
  // Pixels -> latents, token fields -> "txt" / "txt_mask" / "vec", in place, on the device.
  void encode(data::Batch& batch);

 private:
  OnlineEncoder(FrozenEncoders& encoders, bool images, bool text) : encoders_(encoders), images_(images), text_(text) {}
  FrozenEncoders& encoders_;
  bool images_, text_;
};

}  // namespace flowtrain::trainer
