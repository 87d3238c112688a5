// An in-memory image set: what the IDX source (Fashion-MNIST), the compositions source and the
// synthetic source produce, and what the loader draws batches from.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

namespace flowtrain::data {

struct ImageDataset {
  at::Tensor images;        // uint8 [N, C, H, W], or clips [N, T, C, H, W] (the shard loader's layout);
                            // float [N, z, h, w]: latents, the model's inputs as they are (a set
                            // encoded once through the autoencoder, trainer/frozen/online_encoding.h)
  at::Tensor labels;        // int64 [N] (all 0 for a data set without classes)
  int64_t num_classes = 0;
  // Further per-sample tensors, each [N, ...], handed out with the images under their names:
  // the text of a captioned set ("tokens" int64 [N, L] + "txt_mask" bool [N, L]) or its
  // precomputed embeddings ("txt" [N, L, D], "txt_mask", "vec" [N, D']).
  std::map<std::string, at::Tensor> fields;
  int64_t size() const { return images.defined() ? images.size(0) : 0; }
  // Bytes held: images, labels and fields (the memory estimate counts them on the CPU).
  int64_t nbytes() const {
    int64_t n = int64_t((images.defined() ? images.nbytes() : 0) + (labels.defined() ? labels.nbytes() : 0));
    for (const auto& [name, t] : fields) n += int64_t(t.nbytes());
    return n;
  }
};

// N random images with random labels, a pure function of the seed: for benchmarks and tests
// that must not depend on a data set being installed.
// frames > 1: N random clips [N, T, C, H, W] instead.
ImageDataset make_synthetic_dataset(int64_t n, int64_t channels, int64_t side, int64_t num_classes, uint64_t seed,
                                    int64_t frames = 1);

}  // namespace flowtrain::data
