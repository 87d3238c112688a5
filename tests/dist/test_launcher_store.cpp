// Ranks rendezvous on a store their launcher hosts (torchrun's agent store, `flowtrain launch`):
// every rank is a client, and the ranks of a restarted attempt — torchrun --max-restarts restarts
// them against the same long-lived store — start clean instead of meeting the keys of the attempt
// before (which made every restarted rank 0 fail with "rank 0 was claimed by two processes").
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "parallel/launcher_store.h"
#include "parallel/runtime.h"
#include "rank_runner.h"

namespace flowtrain::test {
namespace {

// One attempt: two ranks meet, and an all-reduce across them gives 1 + 2.
std::vector<std::string> attempt(int store_port, int64_t number) {
  return run_thread_ranks(2, parallel::MeshShape{1, 2, 1, 1}, store_port, number,
                          [](int rank, parallel::Runtime& runtime) {
                            const at::Tensor t = at::full({1}, double(rank + 1), at::kDouble);
                            runtime.world_group().all_reduce(t, parallel::ReduceOp::Sum)->wait();
                            if (t.item<double>() != 3.0)
                              throw std::runtime_error("all-reduce gave " + std::to_string(t.item<double>()));
                          });
}

TEST(DistLauncherStore, ARestartedAttemptRendezvousesOnTheSameStore) {
  const parallel::LauncherStore store(0);
  for (int64_t n : {0, 1}) {
    const auto errors = attempt(store.port(), n);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "attempt " << n << ", rank " << r;
  }
  // The attempt's keys are what keeps two processes from claiming one rank: running attempt 1
  // again on the same store is exactly that, and must still be refused by name.
  const auto errors = attempt(store.port(), 1);
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank " + std::to_string(r) + " was claimed by two processes"), std::string::npos)
        << "rank " << r << ": " << errors[r];
}

}  // namespace
}  // namespace flowtrain::test
