// The DiT family's keys of the `model:` section (besides ModelConfig's own): read as
// model.family<DiTConfig>(), declared to the schema by dit_family() (dit_family.cpp).
#pragma once

#include <cstdint>

namespace flowtrain::trainer::families {

struct DiTConfig {
  int64_t num_classes = 1000;   // class labels 0 … num_classes-1; num_classes is the null class
  double class_dropout = 0.1;   // probability a label is replaced by the null class in training
  bool learn_sigma = false;     // true: output 2·C channels as the original DiT (second half unused)
};

}  // namespace flowtrain::trainer::families
