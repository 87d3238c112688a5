// Context-parallel attention against the non-parallel attention: P ranks as threads over real
// Gloo groups (loopback TCPStore), each holding one contiguous chunk of the sequence. The
// outputs and the gradients of q, k and v of every chunk must equal the unsplit float64
// computation's, for Ulysses and ring at P = 2 and 4 and the hybrid at 2 × 2, and the sequence
// split/gather must be each other's inverse with the right gradient.
#include "rank_runner.h"

#include "parallel/context.h"
#include "parallel/runtime.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flowtrain;

namespace {

// The reference: softmax(q·kᵀ/√Dh)·v, written out.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  return at::softmax(at::matmul(q, k.transpose(-2, -1)) * scale, -1).matmul(v);
}

struct Chunk {
  at::Tensor out, dq, dk, dv;
  std::string error;
};

// `world` in-process ranks forming one context group (split as Ulysses `ulysses` × ring for the
// hybrid).
template <typename Body>
std::vector<std::string> run_context_ranks(int world, Body body, int64_t ulysses = 1) {
  return test::run_thread_ranks(world, parallel::MeshShape{1, 1, world, ulysses}, body);
}

void expect_parallel_attention_matches_reference(parallel::ContextAttention kind, int world,
                                                 parallel::RingKernel kernel = parallel::RingKernel::Auto,
                                                 int64_t ulysses = 1) {
  SCOPED_TRACE(std::string(parallel::name(kind)) + " at cp " + std::to_string(world) + ", ring kernel " + std::to_string(int(kernel)) +
               ", ulysses " + std::to_string(ulysses));
  const int64_t B = 2, H = 4, N = 12, Dh = 8, n = N / world;
  at::manual_seed(11);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // Scores of order 1–3 (not tiny), so the softmax is far from uniform and every block matters.
  const at::Tensor q = at::randn({B, H, N, Dh}, f64) * 1.5, k = at::randn({B, H, N, Dh}, f64) * 1.5,
                   v = at::randn({B, H, N, Dh}, f64), grad_out = at::randn({B, H, N, Dh}, f64);

  at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  at::Tensor ref = reference_attention(rq, rk, rv);
  ref.backward(grad_out);

  std::vector<Chunk> chunks(world);
  auto errors = run_context_ranks(world, [&](int rank, parallel::Runtime& runtime) {
    parallel::LocalAttention attention =
        kind == parallel::ContextAttention::Ring ? [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_) {
          return parallel::ring_attention(q_, k_, v_, runtime.context_group(), kernel);
        } : parallel::context_attention(kind, runtime, reference_attention);
    at::Tensor cq = q.narrow(2, rank * n, n).clone().requires_grad_();
    at::Tensor ck = k.narrow(2, rank * n, n).clone().requires_grad_();
    at::Tensor cv = v.narrow(2, rank * n, n).clone().requires_grad_();
    at::Tensor out = attention(cq, ck, cv);
    out.backward(grad_out.narrow(2, rank * n, n));
    chunks[rank] = {out.detach(), cq.grad(), ck.grad(), cv.grad(), ""};
  }, ulysses);
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // float64 throughout; the parallel versions only add the same terms in another order (block
  // by block, log-sum-exp merges), so agreement to ~1e-13 of values of order 1 is expected;
  // 1e-11 leaves room for the exp/log round trips of the ring merge.
  const double tol = 1e-11;
  for (int r = 0; r < world; ++r) {
    auto mine = [&](const at::Tensor& full) { return full.narrow(2, r * n, n); };
    EXPECT_LT((chunks[r].out - mine(ref.detach())).abs().max().item<double>(), tol) << "output, rank " << r;
    EXPECT_LT((chunks[r].dq - mine(rq.grad())).abs().max().item<double>(), tol) << "dq, rank " << r;
    EXPECT_LT((chunks[r].dk - mine(rk.grad())).abs().max().item<double>(), tol) << "dk, rank " << r;
    EXPECT_LT((chunks[r].dv - mine(rv.grad())).abs().max().item<double>(), tol) << "dv, rank " << r;
  }
}

}  // namespace

TEST(DistContext, UlyssesAttentionEqualsTheUnsplitAttentionForwardAndBackward) {
  expect_parallel_attention_matches_reference(parallel::ContextAttention::Ulysses, 2);
  expect_parallel_attention_matches_reference(parallel::ContextAttention::Ulysses, 4);
}

TEST(DistContext, RingAttentionEqualsTheUnsplitAttentionForwardAndBackward) {
  // Both block kernels: ATen's CPU flash kernel (the default here) and the matmul version (the
  // default on other devices).
  for (auto kernel : {parallel::RingKernel::CpuFlash, parallel::RingKernel::Math}) {
    expect_parallel_attention_matches_reference(parallel::ContextAttention::Ring, 2, kernel);
    expect_parallel_attention_matches_reference(parallel::ContextAttention::Ring, 4, kernel);
  }
}

TEST(DistContext, HybridUlyssesInsideRingAcrossEqualsTheUnsplitAttentionForwardAndBackward) {
  // cp 4 as Ulysses 2 × ring 2: each rank attends with 2 of the 4 heads over 6 of the 12 tokens
  // after the all-to-all, the ring walks the other 6.
  expect_parallel_attention_matches_reference(parallel::ContextAttention::Hybrid, 4, parallel::RingKernel::Auto, 2);
}

TEST(DistContext, HybridAttentionNeedsTheHybridSplitOfTheMesh) {
  const int world = 2;
  std::vector<std::string> messages(world);
  auto errors = run_context_ranks(world, [&](int rank, parallel::Runtime& runtime) {
    try {
      parallel::context_attention(parallel::ContextAttention::Hybrid, runtime, reference_attention);
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "");
    EXPECT_NE(messages[r].find("no hybrid context-parallel groups"), std::string::npos) << messages[r];
  }
}

TEST(DistContext, RingAttentionInFloat32StaysWithinFloat32Rounding) {
  // The training path: fp32 inputs, fp32 accumulation. Same check at fp32 precision.
  const int world = 4;
  const int64_t B = 1, H = 2, N = 64, Dh = 16, n = N / world;
  at::manual_seed(5);
  const at::Tensor q = at::randn({B, H, N, Dh}) * 2, k = at::randn({B, H, N, Dh}) * 2, v = at::randn({B, H, N, Dh});
  const at::Tensor ref = reference_attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble));
  std::vector<at::Tensor> outs(world);
  auto errors = run_context_ranks(world, [&](int rank, parallel::Runtime& runtime) {
    outs[rank] = parallel::ring_attention(q.narrow(2, rank * n, n).contiguous(), k.narrow(2, rank * n, n).contiguous(),
                                          v.narrow(2, rank * n, n).contiguous(), runtime.context_group());
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  // Outputs are convex combinations of v (|v| ≲ 4): fp32 rounding of ~64-term sums, a few 1e-7
  // relative; 1e-5 absolute is 30× that and far below any real error (a lost block shifts
  // outputs by ~1e-1).
  EXPECT_LT((at::cat(outs, 2).to(at::kDouble) - ref).abs().max().item<double>(), 1e-5);
}

TEST(DistContext, SplitAndGatherAreInversesAndGatherKeepsThisRanksGradient) {
  const int world = 2;
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 6, 5}, at::TensorOptions().dtype(at::kDouble));
  std::vector<at::Tensor> gathered(world), grads(world);
  auto errors = run_context_ranks(world, [&](int rank, parallel::Runtime& runtime) {
    at::Tensor leaf = x.clone().requires_grad_();
    at::Tensor mine = parallel::split_sequence(leaf, runtime.context_group(), 1);
    at::Tensor all = parallel::gather_sequence(mine * 2, runtime.context_group(), 1);
    // A loss every rank computes identically on the gathered tensor.
    all.pow(2).sum().backward();
    gathered[rank] = all.detach();
    grads[rank] = leaf.grad();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < world; ++r) EXPECT_TRUE(at::equal(gathered[r], x * 2)) << "rank " << r;
  // d/dx Σ(2x)² = 8x, and each rank's share is its own tokens: the shares add up to the whole.
  EXPECT_TRUE(at::equal(grads[0] + grads[1], x * 8));
  EXPECT_TRUE(at::equal(grads[0].narrow(1, 3, 3), at::zeros({2, 3, 5}, x.options())));
}

TEST(DistContext, UlyssesRejectsHeadsThatDoNotSplit) {
  const int world = 2;
  std::vector<std::string> messages(world);
  auto errors = run_context_ranks(world, [&](int rank, parallel::Runtime& runtime) {
    const at::Tensor t = at::randn({1, 3, 4, 8});  // 3 heads over 2 ranks
    try {
      parallel::ulysses_attention(t, t, t, runtime.context_group(), reference_attention);
    } catch (const std::exception& e) {
      messages[rank] = e.what();
    }
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "");
    EXPECT_NE(messages[r].find("3 heads do not split over 2"), std::string::npos) << messages[r];
  }
}
