// Runs the flowtrain binary the way a user does and reads what it leaves in the run directory.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace flowtrain::test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `flowtrain ARGS` through /bin/sh (ARGS is shell text; `env` is prefixed as VAR=value ...).
CommandResult run_flowtrain(const std::string& args, const std::string& env = "");

// The tiny test config for model.arch `arch`: tests/configs/tiny_fashion.yaml (a DiT's) for
// dit; for another family, a copy whose model section keeps only the keys every family has
// (model.num_classes is the DiT's own key, an error under another family), to --set its own.
std::string tiny_config(const std::string& arch = "dit");

// flowtrain train on tiny_config(arch) into `out_dir`, with extra --set flags.
CommandResult train_tiny(const std::string& out_dir, const std::vector<std::string>& sets = {},
                         const std::string& env = "", const std::string& arch = "dit");

// run_dir/checkpoints/step-NNNNNNN: where a run's checkpoint of `step` lives.
std::string ckpt(const std::string& run_dir, int step);

// The training-step rows of run_dir/metrics.jsonl (those with a loss), in order.
std::vector<nlohmann::json> read_metrics(const std::string& run_dir);
// The mean "loss" of rows [begin, end) of read_metrics' rows.
double mean_loss(const std::vector<nlohmann::json>& rows, size_t begin, size_t end);
// The rows holding `key` (checkpoint_blocked_s, eval_fd, …), in order.
std::vector<nlohmann::json> read_metric_rows(const std::string& run_dir, const std::string& key);

// What Perfetto's / chrome://tracing's JSON importer would reject or misdraw in a Chrome trace:
// a missing traceEvents array, complete ("X") events without numeric ts/dur ≥ 0/pid/tid, or
// slices on one thread that overlap without nesting. Returns "" for a clean trace.
std::string chrome_trace_problems(const nlohmann::json& trace);

}  // namespace flowtrain::test
