// Quality metrics (trainer/eval/quality.h) against closed forms and independently computed float64
// references.
#include "trainer/eval/quality.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

using namespace flowtrain::trainer;

namespace {

at::Generator make_gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

// n samples in d dimensions whose *sample* mean is exactly `mean` and whose *sample* covariance
// (divisor n − 1) is exactly diag(stddev²) up to round-off: orthonormal columns, orthogonal to
// the all-ones vector, from the QR of a Gaussian matrix. The diagonal closed form then applies to
// the data itself, not just to the distribution it was drawn from.
at::Tensor exact_diagonal_samples(int64_t n, const at::Tensor& mean, const at::Tensor& stddev, uint64_t seed) {
  const int64_t d = mean.size(0);
  at::Generator gen = make_gen(seed);
  at::Tensor g = at::cat({at::ones({n, 1}, kF64), at::randn({n, d}, gen, kF64)}, 1);
  at::Tensor q = std::get<0>(at::linalg_qr(g));             // [n, d + 1], q[:, 0] ∝ ones
  at::Tensor z = q.slice(1, 1) * std::sqrt(double(n - 1));  // zero column sums, zᵀz = (n − 1)·I
  return z * stddev + mean;
}

// √A by the Denman–Beavers iteration (Y → A^½, Z → A^−½), valid for A with no eigenvalues on the
// closed negative real axis: Σ₁Σ₂ of two SPD matrices has real positive eigenvalues. A route to
// Tr √(Σ₁Σ₂) that shares nothing with the symmetric-eigendecomposition one under test.
at::Tensor denman_beavers_sqrt(const at::Tensor& a) {
  at::Tensor y = a, z = at::eye(a.size(0), kF64);
  for (int i = 0; i < 100; ++i) {
    at::Tensor y_next = 0.5 * (y + at::linalg_inv(z));
    z = 0.5 * (z + at::linalg_inv(y));
    const double change = (y_next - y).abs().max().item<double>();
    y = y_next;
    if (change < 1e-15 * y.abs().max().item<double>()) break;
  }
  return y;
}

}  // namespace

TEST(Quality, FrechetDistanceOfASetWithItselfIsZero) {
  at::Tensor feats = at::randn({500, 64}, make_gen(1), kF64) * 3.0 + 1.0;
  const double scale = 2 * feature_stats(feats).covariance.trace().item<double>();  // Tr Σ₁ + Tr Σ₂
  EXPECT_LT(std::abs(frechet_distance(feats, feats)), 1e-6 * scale);
  // float32 input (what the classifier produces) goes through the same float64 math
  EXPECT_LT(std::abs(frechet_distance(feats.to(at::kFloat), feats.to(at::kFloat))), 1e-6 * scale);
}

TEST(Quality, FrechetDistanceMatchesTheDiagonalClosedForm) {
  const int64_t d = 8;
  at::Generator gen = make_gen(2);
  at::Tensor mu1 = at::randn({d}, gen, kF64), mu2 = at::randn({d}, gen, kF64) + 0.5;
  at::Tensor sd1 = at::rand({d}, gen, kF64) + 0.5, sd2 = at::rand({d}, gen, kF64) * 2 + 0.1;
  at::Tensor a = exact_diagonal_samples(300, mu1, sd1, 3), b = exact_diagonal_samples(200, mu2, sd2, 4);

  // Independent float64 formula from the sample means and variances of the same data:
  // FD = |μ1 − μ2|² + Σ (σ1² + σ2² − 2·σ1·σ2)
  at::Tensor m1 = a.mean(0), m2 = b.mean(0), v1 = a.var(0), v2 = b.var(0);  // var: divisor n − 1
  const double expected =
      (m1 - m2).pow(2).sum().item<double>() + (v1 + v2 - 2 * (v1 * v2).sqrt()).sum().item<double>();
  // Both sides are float64 sums of O(10) terms of size O(1): 1e-9 relative is round-off headroom.
  EXPECT_NEAR(frechet_distance(a, b), expected, 1e-9 * expected);
  // and the data really has the intended moments (the construction is what makes the test exact)
  EXPECT_LT((v1 - sd1.pow(2)).abs().max().item<double>(), 1e-9);
  EXPECT_LT((m2 - mu2).abs().max().item<double>(), 1e-9);
}

TEST(Quality, FrechetDistanceMatchesDenmanBeaversForCorrelatedFeatures) {
  const int64_t d = 16;
  at::Generator gen = make_gen(5);
  // Correlated Gaussians: x = z·L + μ with random mixing matrices.
  at::Tensor l1 = at::randn({d, d}, gen, kF64) / 4.0, l2 = at::randn({d, d}, gen, kF64) / 3.0;
  at::Tensor a = at::matmul(at::randn({400, d}, gen, kF64), l1) + at::randn({d}, gen, kF64);
  at::Tensor b = at::matmul(at::randn({350, d}, gen, kF64), l2) + at::randn({d}, gen, kF64);

  at::Tensor s1 = at::cov(a.transpose(0, 1)), s2 = at::cov(b.transpose(0, 1));  // torch.cov: divisor n − 1
  const double trace_sqrt = denman_beavers_sqrt(at::matmul(s1, s2)).trace().item<double>();
  const double expected = (a.mean(0) - b.mean(0)).pow(2).sum().item<double>() + s1.trace().item<double>() +
                          s2.trace().item<double>() - 2 * trace_sqrt;
  ASSERT_GT(expected, 0.1);  // far from 0, so a relative tolerance is meaningful
  // Two float64 routes through ~16×16 matrix functions with condition numbers of O(10²): agree to
  // ~1e-12; 1e-6 relative leaves room for the eigenvalue clamping and the iteration's stop.
  EXPECT_NEAR(frechet_distance(a, b), expected, 1e-6 * expected);
  // Symmetric in its arguments (Tr √(Σ₁Σ₂) = Tr √(Σ₂Σ₁)), though computed through Σ₁^½ or Σ₂^½.
  EXPECT_NEAR(frechet_distance(b, a), expected, 1e-6 * expected);
}

TEST(Quality, FrechetDistanceRejectsBadShapes) {
  EXPECT_THROW(frechet_distance(at::randn({10, 4}), at::randn({10, 5})), std::invalid_argument);
  EXPECT_THROW(frechet_distance(at::randn({1, 4}), at::randn({10, 4})), std::invalid_argument);
  EXPECT_THROW(frechet_distance(at::randn({10}), at::randn({10, 4})), std::invalid_argument);
}

TEST(Quality, InceptionScoreClosedForms) {
  // Every prediction equal (here uniform): KL(p(y|x) ‖ p(y)) = 0 for every x, score 1.
  EXPECT_NEAR(inception_score(at::full({100, 10}, 0.1)), 1.0, 1e-12);
  // N confident predictions spread evenly over K classes: KL = log K for every x, score K.
  const int64_t k = 7;
  at::Tensor one_hot = at::one_hot(at::arange(70, at::kLong) % k, k).to(at::kFloat);
  EXPECT_NEAR(inception_score(one_hot), double(k), 1e-9);
  // Two mirrored soft predictions: p(y) = (½, ½), KL = 0.9·ln 1.8 + 0.1·ln 0.2 for both.
  at::Tensor soft = at::tensor({0.9, 0.1, 0.1, 0.9}, kF64).reshape({2, 2});
  EXPECT_NEAR(inception_score(soft), std::exp(0.9 * std::log(1.8) + 0.1 * std::log(0.2)), 1e-12);
  EXPECT_THROW(inception_score(at::ones({5})), std::invalid_argument);
}

TEST(Quality, ClassAccuracy) {
  at::Tensor logits = at::tensor({2.0, 1.0, 0.0, 3.0, 5.0, -1.0, 0.0, 1.0}).reshape({4, 2});
  EXPECT_DOUBLE_EQ(class_accuracy(logits, at::tensor({0, 1, 1, 1}, at::kLong)), 0.75);
  EXPECT_DOUBLE_EQ(class_accuracy(logits, at::tensor({0, 1, 0, 1}, at::kLong)), 1.0);
  EXPECT_DOUBLE_EQ(class_accuracy(logits, at::tensor({1, 0, 1, 0}, at::kLong)), 0.0);
  EXPECT_THROW(class_accuracy(logits, at::tensor({0, 1}, at::kLong)), std::invalid_argument);
}
