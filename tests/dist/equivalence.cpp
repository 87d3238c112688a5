#include "equivalence.h"

#include "cli_runner.h"
#include "rank_runner.h"
#include "test_util.h"

#include "trainer/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;

namespace flowtrain::test {

const std::vector<std::string> kCommon = {"train.steps=20", "train.log_every=1", "train.threads=1", "data.workers=1",
                                          "checkpoint.every=0", "train.tensorboard=false"};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> all = kCommon;
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

std::string final_checkpoint(const std::string& run) { return run + "/checkpoints/step-0000020"; }

void run_world(int world, const std::string& run, const std::vector<std::string>& sets,
               const std::vector<std::string>& env, const std::string& arch) {
  if (world == 1) {
    ASSERT_TRUE(env.empty()) << "run_world: environment for a single-process run is not supported";
    auto r = train_tiny(run, sets, "", arch);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    return;
  }
  RankJob job;
  job.world = world;
  job.args = tiny_train_args(run, sets, arch);
  job.extra_env = env;
  job.log_dir = fs::path(run).parent_path().string();
  job.deadline = std::chrono::seconds(240);
  auto results = run_ranks(job);
  for (int r = 0; r < world; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
}

Difference compare_runs(const std::string& a, const std::string& b) {
  Difference d;
  auto ma = read_metrics(a), mb = read_metrics(b);
  EXPECT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < std::min(ma.size(), mb.size()); ++i) {
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    d.loss_rel = std::max(d.loss_rel, std::abs(la - lb) / std::abs(la));
    const double ga = ma[i]["grad_norm"].get<double>(), gb = mb[i]["grad_norm"].get<double>();
    d.grad_norm_rel = std::max(d.grad_norm_rel, std::abs(ga - gb) / std::abs(ga));
    if (i == 0) d.first_grad_norm_ratio = gb / ga;
  }
  auto ca = trainer::load_checkpoint(final_checkpoint(a)), cb = trainer::load_checkpoint(final_checkpoint(b));
  auto max_diff = [](const trainer::NamedTensors& x, const trainer::NamedTensors& y) {
    EXPECT_EQ(x.size(), y.size());
    double m = 0;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      EXPECT_EQ(x[i].second.sizes(), y[i].second.sizes()) << x[i].first;
      m = std::max(m, (x[i].second - y[i].second).abs().max().item<double>());
    }
    return m;
  };
  d.weight_abs = max_diff(ca.model, cb.model);
  d.ema_abs = max_diff(ca.ema, cb.ema);
  return d;
}

void expect_equivalent(const std::string& reference, const std::string& run, const char* what) {
  Difference d = compare_runs(reference, run);
  std::printf("[equivalence] %s: max loss rel diff %.3g, max grad-norm rel diff %.3g, max weight abs diff %.3g, "
              "max EMA abs diff %.3g\n",
              what, d.loss_rel, d.grad_norm_rel, d.weight_abs, d.ema_abs);
  EXPECT_LE(d.loss_rel, kLossRelTol) << what;
  EXPECT_LE(d.grad_norm_rel, kGradNormRelTol) << what;
  EXPECT_LE(d.weight_abs, kWeightAbsTol) << what;
  EXPECT_LE(d.ema_abs, kWeightAbsTol) << what;
}

int64_t peak_state_bytes(const std::string& run, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.json", rank);
  auto j = nlohmann::json::parse(read_file(run + "/ranks/" + name));
  return j["peak_state_bytes"].get<int64_t>();
}

}  // namespace flowtrain::test
