#include "trainer/eval/quality.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>

namespace flowtrain::trainer {

namespace {

std::string shape_string(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ", ")); }

at::Tensor to_cpu_double(const at::Tensor& t) { return t.detach().to(at::kCPU, at::kDouble); }

// Σ^½ of a symmetric PSD matrix: V·diag(√max(w, 0))·Vᵀ from its eigendecomposition.
at::Tensor psd_sqrt(const at::Tensor& sym) {
  auto [w, v] = at::linalg_eigh(sym);
  return at::matmul(v * w.clamp_min(0).sqrt().unsqueeze(0), v.transpose(0, 1));
}

}  // namespace

FeatureStats feature_stats(const at::Tensor& features) {
  if (!features.defined() || features.dim() != 2 || features.size(0) < 2)
    throw std::invalid_argument("feature_stats: features must be [N >= 2, D], got " +
                                (features.defined() ? shape_string(features) : std::string("undefined")));
  at::Tensor x = to_cpu_double(features);
  FeatureStats stats;
  stats.count = x.size(0);
  stats.mean = x.mean(0);
  at::Tensor centered = x - stats.mean;
  stats.covariance = at::matmul(centered.transpose(0, 1), centered) / static_cast<double>(stats.count - 1);
  return stats;
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  if (a.mean.size(0) != b.mean.size(0))
    throw std::invalid_argument(fmt::format("frechet_distance: feature dimensions differ ({} vs {})",
                                            a.mean.size(0), b.mean.size(0)));
  const double mean_term = (a.mean - b.mean).pow(2).sum().item<double>();
  at::Tensor s1_half = psd_sqrt(a.covariance);
  at::Tensor m = at::matmul(at::matmul(s1_half, b.covariance), s1_half);
  m = (m + m.transpose(0, 1)) * 0.5;  // exactly symmetric for eigh (round-off breaks it slightly)
  const double trace_sqrt = at::linalg_eigvalsh(m).clamp_min(0).sqrt().sum().item<double>();
  return mean_term + a.covariance.trace().item<double>() + b.covariance.trace().item<double>() - 2.0 * trace_sqrt;
}

double frechet_distance(const at::Tensor& feats_a, const at::Tensor& feats_b) {
  return frechet_distance(feature_stats(feats_a), feature_stats(feats_b));
}

double inception_score(const at::Tensor& probs) {
  if (!probs.defined() || probs.dim() != 2 || probs.size(0) < 1)
    throw std::invalid_argument("inception_score: probs must be [N >= 1, K], got " +
                                (probs.defined() ? shape_string(probs) : std::string("undefined")));
  at::Tensor p = to_cpu_double(probs);
  at::Tensor marginal = p.mean(0, /*keepdim=*/true);                     // p(y)  [1, K]
  at::Tensor kl = (at::xlogy(p, p) - at::xlogy(p, marginal)).sum(1);    // KL(p(y|x) ‖ p(y))  [N]
  return std::exp(kl.mean().item<double>());
}

double class_accuracy(const at::Tensor& logits, const at::Tensor& labels) {
  if (!logits.defined() || !labels.defined() || logits.dim() != 2 || labels.dim() != 1 ||
      logits.size(0) != labels.size(0) || logits.size(0) < 1)
    throw std::invalid_argument("class_accuracy: need logits [N >= 1, K] and labels [N], got " +
                                (logits.defined() ? shape_string(logits) : std::string("undefined")) + " and " +
                                (labels.defined() ? shape_string(labels) : std::string("undefined")));
  at::Tensor predicted = logits.detach().argmax(1).to(at::kCPU);
  return predicted.eq(labels.detach().to(at::kCPU, at::kLong)).to(at::kDouble).mean().item<double>();
}

}  // namespace flowtrain::trainer
