// The per-rank memory estimate (trainer/memory_estimate.h) against the peak it predicts, measured:
// `flowtrain bench` at world 1, 2 and 4 reports both (estimated_peak_bytes beside the CPU tensor
// allocator's peak_allocated_bytes, every rank's). Two runs that stress different terms: the
// text-to-image Flux with every activation kept (activations and the math attention's
// probabilities dominate), and a wider one under full activation checkpointing with a small
// batch (the sharded state, FSDP's gathered units and reduce buffers, and the recompute dominate).
#include "cli_runner.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace flowtrain::test;

namespace {

// The bar for the estimate: within 15 % of the measured peak on every rank. Measured when
// written (docs/perf.md, "Memory estimate"): every case within −8.1 % … +3.4 %; a missing term
// (the in-memory data set, 37 MiB here, or FSDP's kept buffers) or a mis-counted activation (the
// attention's [H, T, T] probabilities are 7 % of a block) moves a case past it.
constexpr double kTolerance = 0.15;

void expect_estimate_within_bound(const std::string& name, const std::string& sets) {
  const std::string base = scratch_dir("memory_estimate_" + name);
  for (int world : {1, 2, 4}) {
    const std::string json = base + "/world" + std::to_string(world) + ".json";
    const std::string bench = "bench -c " + source_path("configs/fashion_t2i.yaml") +
                              " --synthetic --steps 2 --warmup 1 --set train.threads=1 " + sets + " --json " + json;
    const auto r = run_flowtrain(world == 1 ? bench : "launch --nproc-per-node " + std::to_string(world) + " -- " + bench);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto report = nlohmann::json::parse(read_file(json));
    const int64_t estimate = report["estimated_peak_bytes"].get<int64_t>();
    ASSERT_GT(estimate, 0) << report.dump(2);
    const std::vector<int64_t> measured =
        world == 1 ? std::vector<int64_t>{report["peak_allocated_bytes"].get<int64_t>()}
                   : report["peak_allocated_bytes_per_rank"].get<std::vector<int64_t>>();
    ASSERT_EQ(measured.size(), size_t(world));
    for (int rank = 0; rank < world; ++rank) {
      const double error = double(estimate) / double(measured[rank]) - 1.0;
      std::printf("[memory] %s world %d rank %d: estimated %.1f MiB, measured %.1f MiB (%+.1f%%)\n", name.c_str(),
                  world, rank, estimate / 1048576.0, measured[rank] / 1048576.0, 100 * error);
      EXPECT_LE(std::abs(error), kTolerance) << name << " world " << world << " rank " << rank;
    }
  }
}

}  // namespace

TEST(MemoryEstimate, WithinFifteenPercentOfTheMeasuredPeakWithEveryActivationKept) {
  expect_estimate_within_bound("kept", "--set train.activation_checkpointing=none");
}

TEST(MemoryEstimate, WithinFifteenPercentOfTheMeasuredPeakUnderFullCheckpointingOfAWiderModel) {
  expect_estimate_within_bound("recomputed", "--set model.hidden=384 --set model.axes_dim=16,40,40 "
                                             "--set data.batch_size=4 --set train.activation_checkpointing=full");
}
