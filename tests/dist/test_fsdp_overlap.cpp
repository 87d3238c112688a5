// FSDP mechanics inside one process: two ranks as threads over real Gloo groups (loopback
// TCPStore). Checks the schedule (prefetch, reduce-scatter during backward) and that the
// reduced shard gradients equal the unsharded model's gradients on the whole batch.
#include "rank_runner.h"
#include "test_util.h"

#include "models/dit/dit.h"
#include "models/flux/flux.h"
#include "parallel/fsdp.h"
#include "parallel/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace flowtrain;

namespace {

constexpr int kDepth = 4;
models::DiT make_model(uint64_t seed) { return test::perturbed_small_dit(kDepth, seed); }

int64_t index_of(const std::vector<std::string>& events, const std::string& what) {
  auto it = std::find(events.begin(), events.end(), what);
  return it == events.end() ? -1 : static_cast<int64_t>(it - events.begin());
}

struct RankOutput {
  std::vector<std::string> events;
  std::vector<std::pair<std::string, at::Tensor>> shard_grads;
  std::vector<parallel::FsdpUnitLayout> layout;
  std::string error;
};

}  // namespace

TEST(DistFsdp, GathersArePrefetchedReduceScattersOverlapBackwardAndGradsMatchUnsharded) {
  const int world = 2;
  const int64_t batch = 8;
  at::manual_seed(7);
  const at::Tensor x = at::randn({batch, 4, 8, 8}), t = at::rand({batch}), y = at::randint(0, 10, {batch});
  // One model per rank, built before the threads start (model init uses the global generator).
  std::vector<models::DiT> models = {make_model(1), make_model(1)};
  std::vector<RankOutput> out(world);

  auto errors = test::run_thread_ranks(world, parallel::MeshShape{}, [&](int rank, parallel::Runtime& runtime) {
    models::DiT& model = models[rank];
    parallel::FullyShardedModule fsdp(*model, model->units(), runtime.shard_group(), nullptr, {});
    fsdp.set_event_log(&out[rank].events);
    model->unit_runner = [&](int64_t i, const models::UnitCall& call, const models::Tensors& inputs) {
      return fsdp.run_unit(i, inputs, [&] { return call(inputs); });
    };
    const int64_t half = batch / world;
    fsdp.set_gradient_sync(true);
    fsdp.begin_forward();
    at::Tensor v = model->forward(x.narrow(0, rank * half, half), t.narrow(0, rank * half, half),
                                  y.narrow(0, rank * half, half));
    v.pow(2).mean().backward();
    fsdp.finish_backward();
    for (const auto& [name, shard] : fsdp.named_shards()) out[rank].shard_grads.emplace_back(name, shard.grad().clone());
    out[rank].layout = fsdp.layout();
    model->unit_runner = nullptr;
  });
  for (int r = 0; r < world; ++r) out[r].error = errors[r];
  ASSERT_EQ(out[0].error, "");
  ASSERT_EQ(out[1].error, "");

  // Schedule, as rank 0 saw it.
  const auto& ev = out[0].events;
  std::string all;
  for (const auto& e : ev) all += e + "\n";
  const int depth = kDepth;
  for (int i = 0; i + 1 < depth; ++i) {
    const std::string next = "blocks." + std::to_string(i + 1), cur = "blocks." + std::to_string(i);
    ASSERT_GE(index_of(ev, "gather_issue " + next), 0) << all;
    EXPECT_LT(index_of(ev, "gather_issue " + next), index_of(ev, "forward_end " + cur))
        << "unit " << i + 1 << "'s all-gather must be issued before unit " << i << "'s forward ends\n" << all;
  }
  if (::testing::Test::HasFailure() || std::getenv("FLOWTRAIN_PRINT_FSDP_EVENTS")) std::printf("%s", all.c_str());
  const int64_t end = index_of(ev, "backward_end");
  ASSERT_GE(end, 0) << all;
  for (int i = 2; i < depth; ++i) {
    EXPECT_GE(index_of(ev, "reduce_issue blocks." + std::to_string(i)), 0) << all;
    EXPECT_LT(index_of(ev, "reduce_issue blocks." + std::to_string(i)),
              index_of(ev, "backward_begin blocks." + std::to_string(i - 2)))
        << "unit " << i << "'s reduce-scatter must be issued while earlier units still run backward\n" << all;
  }
  // Backward re-gathers: unit i−1's gather is issued when unit i's backward begins (prefetch).
  for (int i = 1; i < depth; ++i) {
    const std::string prev = "gather_issue blocks." + std::to_string(i - 1);
    const int64_t bwd = index_of(ev, "backward_begin blocks." + std::to_string(i));
    const auto second_gather = std::find(ev.begin() + bwd, ev.end(), prev);
    EXPECT_TRUE(second_gather != ev.end() &&
                second_gather - ev.begin() < index_of(ev, "backward_begin blocks." + std::to_string(i - 1)))
        << "unit " << i - 1 << " must be re-gathered (prefetched) during unit " << i << "'s backward\n" << all;
  }

  // The stem (embedders) is released once block 0 starts and gathered again, prefetched, when
  // block 0's backward begins; the head (final layer) is gathered while the last block runs.
  const std::string last = "blocks." + std::to_string(depth - 1);
  EXPECT_LT(index_of(ev, "release stem"), index_of(ev, "forward_begin blocks.0")) << all;
  EXPECT_LT(index_of(ev, "gather_issue head"), index_of(ev, "forward_end " + last)) << all;
  const int64_t bwd0 = index_of(ev, "backward_begin blocks.0");
  EXPECT_TRUE(std::find(ev.begin() + bwd0, ev.end(), "gather_issue stem") != ev.end())
      << "the stem must be re-gathered for the embedders' backward\n" << all;
  // Gradient buffers are freed as their reductions complete, during backward: never more than
  // kMaxReducesInFlight flat unsharded gradients at once, and the head's is gone before block 0's
  // backward starts.
  int64_t in_flight = 0, most = 0;
  for (const auto& e : ev) {
    if (e.rfind("reduce_issue ", 0) == 0) most = std::max(most, ++in_flight);
    if (e.rfind("reduce_done ", 0) == 0) --in_flight;
  }
  EXPECT_EQ(in_flight, 0) << all;
  EXPECT_LE(most, static_cast<int64_t>(parallel::FullyShardedModule::kMaxReducesInFlight)) << all;
  EXPECT_LT(index_of(ev, "reduce_done head"), bwd0) << all;

  // Numbers: the unsharded model on the whole batch (mean loss) has the gradient the two ranks'
  // averaged half-batch gradients make. Differences come only from summation order (fp32).
  models::DiT reference = make_model(1);
  reference->forward(x, t, y).pow(2).mean().backward();
  std::map<std::string, at::Tensor> ref_grads;
  for (const auto& item : reference->named_parameters())
    if (item.value().grad().defined()) ref_grads[item.key()] = item.value().grad();
  for (size_t u = 0; u < out[0].layout.size(); ++u) {
    const auto& unit = out[0].layout[u];
    at::Tensor flat = at::cat({out[0].shard_grads[u].second, out[1].shard_grads[u].second});
    for (const auto& p : unit.params) {
      at::Tensor got = flat.narrow(0, p.offset, p.numel).view(p.shape);
      const at::Tensor& want = ref_grads.at(p.name);
      // fp32 sums of 4-sample halves vs one 8-sample sum: a few ulps of the largest term.
      EXPECT_TRUE(at::allclose(got, want, /*rtol=*/1e-4, /*atol=*/1e-6))
          << p.name << ": max diff " << (got - want).abs().max().item<double>();
    }
    // Padding stays zero.
    EXPECT_EQ(flat.narrow(0, unit.numel, unit.padded_numel - unit.numel).abs().sum().item<double>(), 0.0) << unit.name;
  }
}

TEST(DistFsdp, FluxDoubleAndSingleBlocksAreUnitsAndTheirShardGradientsMatchUnsharded) {
  // Flux's units take and return tensor lists (a double block returns the image and text
  // streams): under FSDP at world 2 the reduced shard gradients must be the unsharded model's.
  const int world = 2;
  const int64_t batch = 4;
  models::FluxOptions o = models::flux_size("flux-tiny");
  o.in_channels = 4;
  o.patch = 2;
  o.input_size = 8;
  o.text_len = 5;
  auto make = [&] {
    at::manual_seed(5);
    models::Flux m(o);
    at::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.add_(at::randn(p.sizes()) * 0.05);  // off the adaLN-Zero init
    return m;
  };
  at::manual_seed(8);
  const at::Tensor x = at::randn({batch, 4, 8, 8}), t = at::rand({batch});
  const models::Conditioning cond{{"txt", at::randn({batch, 5, o.context_dim})}, {"vec", at::randn({batch, o.vec_dim})}};
  std::vector<models::Flux> flux = {make(), make()};
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> grads(world);
  std::vector<std::vector<parallel::FsdpUnitLayout>> layouts(world);
  auto errors = test::run_thread_ranks(world, parallel::MeshShape{}, [&](int rank, parallel::Runtime& runtime) {
    models::Flux& model = flux[rank];
    parallel::FullyShardedModule fsdp(*model, model->units(), runtime.shard_group(), nullptr, {});
    model->unit_runner = [&](int64_t i, const models::UnitCall& call, const models::Tensors& inputs) {
      return fsdp.run_unit(i, inputs, [&] { return call(inputs); });
    };
    const int64_t half = batch / world;
    fsdp.set_gradient_sync(true);
    fsdp.begin_forward();
    model->forward(x.narrow(0, rank * half, half), t.narrow(0, rank * half, half), cond.rows(rank * half, half))
        .pow(2)
        .mean()
        .backward();
    fsdp.finish_backward();
    for (const auto& [name, shard] : fsdp.named_shards()) grads[rank].emplace_back(name, shard.grad().clone());
    layouts[rank] = fsdp.layout();
    model->unit_runner = nullptr;
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  ASSERT_EQ(layouts[0].size(), 1u + 1u + 2u + 1u);  // stem, 1 double, 2 single, head

  models::Flux reference = make();
  reference->forward(x, t, cond).pow(2).mean().backward();
  std::map<std::string, at::Tensor> want;
  for (const auto& item : reference->named_parameters()) want[item.key()] = item.value().grad();
  for (size_t u = 0; u < layouts[0].size(); ++u) {
    at::Tensor flat = at::cat({grads[0][u].second, grads[1][u].second});
    for (const auto& p : layouts[0][u].params) {
      const at::Tensor got = flat.narrow(0, p.offset, p.numel).view(p.shape);
      // fp32 sums of 2-sample halves vs one 4-sample sum: a few ulps of the largest term.
      EXPECT_TRUE(at::allclose(got, want.at(p.name), /*rtol=*/1e-4, /*atol=*/1e-6))
          << p.name << ": max diff " << (got - want.at(p.name)).abs().max().item<double>();
    }
  }
}
