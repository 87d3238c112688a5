// The Fashion-MNIST classifier behind the quality metrics (trainer/eval/quality.h, trainer/eval/evaluate.h):
// trained by the project on first use and cached on disk, so every evaluation on a machine scores
// samples with the same network.
//
//   <cache_dir>/fashion-classifier-<data hash, 16 hex>.safetensors
//     tensors   the classifier's state dict (conv1.weight, bn1.running_mean, …, fc2.bias)
//     metadata  format, format_version, data_hash, weights_hash, test_accuracy, recipe,
//               train_seconds
//
// The data hash (FNV-1a 64 over the train and test images and labels) names the file, so a
// different or changed data set gets its own classifier. On load the weights are hashed again and
// compared with the metadata, the recipe (epochs, batch, lr, seed, format version) must match the
// requested one, and the file must parse: any mismatch or corruption logs a warning and retrains.
// Writes are atomic (temporary file, fsync, rename), so concurrent processes at worst both train.
#pragma once

#include "data/image_dataset.h"
#include "models/classifier.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace flowtrain::trainer {

// How the classifier is trained: a few epochs of AdamW (no weight decay, i.e. Adam) with a cosine
// learning rate, which reaches > 90 % test accuracy in about two minutes on 2 CPU cores.
struct ClassifierTrainOptions {
  int64_t epochs = 2;
  int64_t batch_size = 128;
  double lr = 3e-3;               // peak; 50 warmup steps, cosine to 0
  uint64_t seed = 0;              // initialisation and data order
  int64_t max_train_images = 0;   // 0 = the whole training split (tests use fewer for speed)
  // > 0: train and test on the images as a judge reads a garment drawn view_side pixels wide
  // (images_seen_at); the transformed data hash names the cache file, so each view has its own.
  int64_t view_side = 0;

  // A canonical one-line description; stored in the cache and compared on load.
  std::string recipe() const;
};

struct TrainedClassifier {
  models::FashionClassifier model{nullptr};  // eval mode, on the requested device
  double test_accuracy = 0.0;                // on the whole test split, measured after training
  std::string path;                          // the cache file
  std::string weights_hash;                  // 16 hex digits, as stored in the cache
  bool trained_now = false;                  // false: loaded from the cache
};

// uint8 [N, 1, 28, 28] images area-averaged down to side × side (how make-moving-fashion draws a
// garment), rounded to uint8 (as stored), and scaled back to 28 × 28 bilinearly (how the motion
// judge reads it): the classifier then learns the garments as the judge will see them.
data::ImageDataset images_seen_at(const data::ImageDataset& images, int64_t side);

// ${FLOWTRAIN_DEPS:-$HOME/.cache/flowtrain}/classifiers
std::string default_classifier_dir();

// FNV-1a 64 over the shapes and raw bytes of the train and test images and labels, as 16 hex digits.
std::string dataset_hash(const data::ImageDataset& train, const data::ImageDataset& test);

// The cached classifier for the Fashion-MNIST in `data_dir`, or a freshly trained one (then
// written to the cache). cache_dir "" = default_classifier_dir(). Throws data::DataError naming the
// file when the data set cannot be read or the cache cannot be written.
TrainedClassifier load_or_train_classifier(const std::string& cache_dir, const std::string& data_dir,
                                           const c10::Device& device, const ClassifierTrainOptions& options = {});

// The same, for splits the caller has already loaded (the evaluator needs them anyway).
TrainedClassifier load_or_train_classifier(const std::string& cache_dir, const data::ImageDataset& train,
                                           const data::ImageDataset& test, const c10::Device& device,
                                           const ClassifierTrainOptions& options = {});

// Always trains (ignoring any cached file) and replaces the cache entry: `flowtrain train-classifier`.
TrainedClassifier train_classifier(const std::string& cache_dir, const data::ImageDataset& train,
                                   const data::ImageDataset& test, const c10::Device& device,
                                   const ClassifierTrainOptions& options = {});

}  // namespace flowtrain::trainer
