// `flowtrain data encode`: an image (+ caption) WebDataset to one whose samples carry what the
// frozen encoders make of them, so training reads latents and embeddings instead of running the
// encoders every step. Per sample:
//   KEY.latent.safetensors   "latent" [z, h, w]: the autoencoder's scaled mean of the image,
//                            resized and centre-cropped to its aspect-ratio bucket first
//   KEY.txt_emb.safetensors  "txt" [t5_max_length, d_model] (T5) and "txt_mask" [t5_max_length]
//   KEY.vec.safetensors      "vec" [hidden] (CLIP's pooled output)
// and every other member (txt, json, cls, …) as it was; the image itself is dropped once encoded.
// The buckets are the config's data.buckets (latent cells, as the training run reads them) times
// the autoencoder's downsampling, or model.image_size cells square without buckets.
//
// Ranks (`flowtrain launch`, srun, …; no collective) take every world-th input shard. Each output
// shard has its input's name and is written to NAME.tmp, then renamed: a rerun after a kill skips
// the finished ones and redoes the rest, so no shard is lost or doubled. Once every output shard
// is in place, the rank that finished last writes OUT/index.json (sample counts, as `flowtrain
// data pack` writes), which the loader reads instead of counting. A damaged sample (no
// image, an image that does not decode, no caption when captions are encoded) is skipped, logged
// and counted, as the loader would.
#pragma once

#include "trainer/config/config.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace flowtrain::trainer {

struct EncodeOptions {
  std::vector<std::string> inputs;    // shard entries or brace patterns (local, http(s), pipe:)
  std::string out_dir;
  at::ScalarType dtype = at::kFloat;  // of the written latents and embeddings: fp32 | bf16
  int64_t batch = 16;                 // samples per encoder call
};

struct EncodeReport {
  int64_t shards = 0;          // written by this rank now
  int64_t skipped_shards = 0;  // already finished before this run
  int64_t samples = 0;         // written
  int64_t damaged = 0;         // skipped
};

EncodeReport encode_shards(const Config& config, const EncodeOptions& options, int64_t rank, int64_t world);

}  // namespace flowtrain::trainer
