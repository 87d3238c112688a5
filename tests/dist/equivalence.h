// Runs of the tiny config at several world sizes / meshes, and their comparison with a
// reference run: the per-step losses and the final weights and EMA. Shared by the FSDP and the
// context-parallel training tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::test {

// 20 logged steps, final checkpoint, one intra-op thread per rank (4 ranks share 2 cores).
extern const std::vector<std::string> kCommon;
// kCommon plus `extra` (--set key=value items).
std::vector<std::string> with(std::vector<std::string> extra);
std::string final_checkpoint(const std::string& run);  // <run>/checkpoints/step-0000020

// Trains the tiny config into `run` with `world` ranks on loopback (one process when world is 1);
// a non-zero exit of any rank fails the calling test with that rank's output. `env` (VAR=value)
// reaches every rank. `arch`: the family of the tiny config (tiny_config).
void run_world(int world, const std::string& run, const std::vector<std::string>& sets,
               const std::vector<std::string>& env = {}, const std::string& arch = "dit");

struct Difference {
  double loss_rel = 0, grad_norm_rel = 0, weight_abs = 0, ema_abs = 0;
  double first_grad_norm_ratio = 1;  // b's step-1 gradient norm over a's (same weights, same batch)
};
// Largest per-step relative loss and gradient-norm (before clipping) differences, and the
// largest final weight / EMA difference.
Difference compare_runs(const std::string& a, const std::string& b);

// Tolerances. The sharded runs do the same fp32 arithmetic in another order: each rank's loss
// is the mean over its own slice of the batch (then averaged), gradients are summed across
// ranks by the reduce-scatter, the grad norm is a sum of per-shard sums (context parallelism
// adds: attention by blocks and log-sum-exp merges, parameter gradients as sums of per-token
// parts). Each reordering changes a result by a few ulps (~1e-7 relative); Adam then normalises
// every update to ~lr per element, so a tiny gradient difference changes a weight by at most
// ~lr × (relative change of m/√v), and over 20 steps these stay far below 1e-4 absolute
// (weights are O(0.1)). A real bug (a missing shard, a wrong average, a skipped micro-batch, a
// lost attention block) moves losses by >1e-3 relative and weights by >1e-3 absolute within a
// few steps, which these bounds would catch.
constexpr double kLossRelTol = 1e-5;
constexpr double kWeightAbsTol = 1e-4;
// The gradient norm (before clipping) is where a wrong reduction factor shows directly: scaled
// gradients change AdamW's updates only through ε and the clip, so losses and weights move by a
// factor-dependent amount that depends on the model's state, while the norm moves by the factor
// itself from step 1 (tests/dist/test_reduction_mutations.cpp measures both). Honest runs compute
// the same gradient with another fp32 reduction order, then drift by the ≤1e-4 weight
// differences above; measured over this suite's runs: ≤ 2.2e-7 relative, the order of the
// losses', so the same bound.
constexpr double kGradNormRelTol = 1e-5;

// compare_runs, printed as "[equivalence] what: …" and checked against the tolerances (loss,
// gradient norm, weights, EMA).
void expect_equivalent(const std::string& reference, const std::string& run, const char* what);

// The rank's peak bytes of training state, from <run>/ranks/rank-RRRRR.json.
int64_t peak_state_bytes(const std::string& run, int rank);

}  // namespace flowtrain::test
