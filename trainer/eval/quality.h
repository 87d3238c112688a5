// Sample-quality metrics on classifier outputs, as pure functions of tensors (no model, no I/O):
// the Fréchet distance between two feature sets (FID's formula, here on the penultimate features
// of our own Fashion-MNIST classifier, see models/classifier.h), the inception-style score, and
// class-conditional accuracy. Everything is computed in float64 on the CPU: the covariance
// matrices are small (D = 256) and the trace term cancels large numbers.
#pragma once

#include <ATen/ATen.h>

namespace flowtrain::trainer {

// Mean and covariance of a feature set: what the Fréchet distance needs of each side, so the
// real side can be computed once and reused across evaluations.
struct FeatureStats {
  at::Tensor mean;        // float64 [D]
  at::Tensor covariance;  // float64 [D, D], unbiased (divides by N − 1, as FID's np.cov)
  int64_t count = 0;      // N
};

// features [N, D] (any floating dtype, any device), N >= 2. Throws std::invalid_argument naming
// the shape otherwise.
FeatureStats feature_stats(const at::Tensor& features);

// ‖μ₁ − μ₂‖² + Tr Σ₁ + Tr Σ₂ − 2·Tr √(Σ₁Σ₂). Tr √(Σ₁Σ₂) is taken as Σᵢ √λᵢ(Σ₁^½ Σ₂ Σ₁^½): that
// matrix is symmetric PSD and similar to Σ₁Σ₂, so two symmetric eigendecompositions (stable,
// real) replace scipy's general sqrtm (complex, occasionally inaccurate); eigenvalues that
// round-off makes slightly negative are clamped to 0. Throws std::invalid_argument if the
// dimensions differ.
double frechet_distance(const FeatureStats& a, const FeatureStats& b);
double frechet_distance(const at::Tensor& feats_a, const at::Tensor& feats_b);  // [N, D], [M, D]

// exp(E_x KL(p(y|x) ‖ p(y))) with p(y) the mean of the rows: 1 when every prediction is the same,
// K when the predictions are confident (one-hot) and spread evenly over K classes.
// probs [N, K], rows summing to 1 (0·log 0 is taken as 0).
double inception_score(const at::Tensor& probs);

// Fraction of rows whose argmax equals the label: logits [N, K], labels [N] (integer).
double class_accuracy(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace flowtrain::trainer
