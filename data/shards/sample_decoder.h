// From a WebDataset sample's member bytes to training tensors. A run declares which members it
// needs (SampleSpec); a sample that lacks one, or whose member does not decode, is damaged —
// decode_sample throws DataError with the reason, and the loader skips and counts it.
//
// Members: `png` / `jpg` / `jpeg` (the image, uint8), `latent.safetensors` (tensor "latent",
// float [C, h, w], in place of the image), `cls` (the class, decimal text), `txt` (the caption,
// turned into fields by the run's text path), `txt_emb.safetensors` (tensors "txt" [L, D] and
// optionally "txt_mask" [L]) with `vec.safetensors` ("vec" [D']) for precomputed text embeddings.
// `json` and other members ride along unread.
#pragma once

#include "data/shards/buckets.h"
#include "data/shards/webdataset.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

namespace flowtrain::data {

// The member a sample's model input comes from.
enum class ImageKind {
  Image,   // png or jpg, decoded
  Latent,  // latent.safetensors (tensor "latent"), as it is
  None,    // no image member
};

struct SampleSpec {
  ImageKind image = ImageKind::Image;
  int64_t channels = 0;         // images: 1 or 3 (gray is replicated to 3; colour to 1 is damage)
  int64_t max_side = 0;         // images larger than this are damage (0: any size)
  bool label = false;           // `cls` required, in [0, num_classes)
  int64_t num_classes = 0;
  bool caption = false;         // `txt` required, turned into fields by caption_fields
  std::function<std::map<std::string, at::Tensor>(const std::string& caption)> caption_fields;
  bool text_embeddings = false; // `txt_emb.safetensors` and `vec.safetensors` required
  std::vector<Bucket> buckets;  // aspect-ratio buckets (buckets.h); empty: one shape, padded
  // Video (`mp4`, data/video.h): a clip of `video_frames` frames (0: not video) at `video_fps`
  // (every round(source fps / video_fps)-th frame; 0: every frame), starting at a frame drawn
  // from the sample's draw seed; the image is then uint8 [T, 3, H, W].
  int64_t video_frames = 0;
  double video_fps = 0;
};

struct DecodedSample {
  at::Tensor image;  // uint8 [C, H, W] for images, float [C, h, w] for latents; undefined for none
  int64_t label = 0;
  std::map<std::string, at::Tensor> fields;
  int64_t bucket = -1;  // with buckets: the index of its shape
};

// The members a spec needs, for messages: e.g. "png|jpg, cls".
std::string required_members(const SampleSpec& spec);

// `draw`: the sample's seed for random choices (a video clip's start): a pure function of
// (run seed, epoch, stream, draw index), so it is the same whichever worker decodes it.
DecodedSample decode_sample(const RawSample& sample, const SampleSpec& spec, uint64_t draw = 0);

}  // namespace flowtrain::data
