// Asynchronous checkpointing through the CLI: async and sync runs write the same checkpoint
// files, a full disk ends the run (on_error: stop) or is retried (warn) without leaving a
// complete-looking checkpoint, and a stop signal during an in-flight save commits that save and
// the stop checkpoint, from which the run resumes bit for bit.
#include "cli_runner.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

void expect_same_tensor_files(const std::string& a, const std::string& b) {
  // The manifests differ by design: each records its run's resolved config (out_dir, async).
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors", "rng.safetensors"})
    EXPECT_EQ(read_file(a + "/" + f), read_file(b + "/" + f)) << f << " differs between " << a << " and " << b;
}

std::vector<std::string> complete_checkpoints(const std::string& run) {
  std::vector<std::string> out;
  if (!fs::exists(run + "/checkpoints")) return out;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    if (fs::exists(e.path() / "manifest.json")) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST(AsyncCheckpoint, AsyncAndSyncRunsWriteTheSameFilesAndRecordEverySave) {
  REQUIRE_DATA();
  const std::string async_run = scratch_dir("async"), sync_run = scratch_dir("sync");
  auto r = train_tiny(async_run, {"checkpoint.every=5", "train.steps=10", "checkpoint.async=true"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("persisted in the background in"), std::string::npos) << r.output;
  r = train_tiny(sync_run, {"checkpoint.every=5", "train.steps=10", "checkpoint.async=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int step : {5, 10}) expect_same_tensor_files(ckpt(async_run, step), ckpt(sync_run, step));
  // verify passes; inspect names the step, the mesh and the tensors.
  r = run_flowtrain("checkpoint verify " + ckpt(async_run, 10));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("4 files match the manifest's sizes and CRC-32s (step 10)"), std::string::npos) << r.output;
  r = run_flowtrain("checkpoint inspect " + ckpt(async_run, 10));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected : {"step 10, samples seen 320", "saved at world size 1: unsharded",
                               "x_embedder.proj.weight  Float  [64, 1, 4, 4]", "optimizer.safetensors ("})
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  // A flipped byte and a truncated file: verify exits 1 naming the file.
  {
    const std::string opt = ckpt(sync_run, 5) + "/optimizer.safetensors";
    std::string bytes = read_file(opt);
    bytes[bytes.size() / 2] ^= 0x5a;
    write_file(opt, bytes);
    r = run_flowtrain("checkpoint verify " + ckpt(sync_run, 5));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("optimizer.safetensors: CRC-32 mismatch"), std::string::npos) << r.output;
    fs::resize_file(ckpt(sync_run, 10) + "/ema.safetensors", 1000);
    r = run_flowtrain("checkpoint verify " + ckpt(sync_run, 10));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("ema.safetensors: 1000 bytes, the manifest says"), std::string::npos) << r.output;
  }
  for (const auto& run : {async_run, sync_run}) {
    const auto saves = read_metric_rows(run, "checkpoint_blocked_s");
    ASSERT_EQ(saves.size(), 2u) << run;
    EXPECT_EQ(saves[0]["step"], 5);
    EXPECT_EQ(saves[1]["step"], 10);
    for (const auto& row : saves) {
      EXPECT_GE(row["checkpoint_persist_s"].get<double>(), 0.0);
      EXPECT_EQ(row["checkpoint_failures"], 0);
    }
  }
}

TEST(AsyncCheckpoint, DiskFullStopsTheRunOrIsRetriedAndNeverLeavesACompleteLookingCheckpoint) {
  REQUIRE_DATA();
  // ulimit -f 256: files up to 256 KiB (logs, metrics) are written, the 740 KB model file is not.
  const std::string full = "ulimit -f 256;";
  const std::string stopped = scratch_dir("stop");
  auto r = train_tiny(stopped, {"checkpoint.every=5", "train.steps=10"}, full);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("model.safetensors.tmp: File too large"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint.on_error: stop"), std::string::npos) << r.output;
  EXPECT_TRUE(complete_checkpoints(stopped).empty());
  EXPECT_FALSE(fs::exists(stopped + "/checkpoints/step-0000005.tmp"));

  // warn: training runs to the end and counts the failures, but a run whose final checkpoint
  // could not be written does not exit 0.
  const std::string warned = scratch_dir("warn");
  r = train_tiny(warned, {"checkpoint.every=5", "train.steps=10", "checkpoint.on_error=warn"}, full);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("step 10/10"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training goes on (checkpoint.on_error: warn"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the final checkpoint (step 10) could not be written"), std::string::npos) << r.output;
  EXPECT_TRUE(complete_checkpoints(warned).empty());
  const auto saves = read_metric_rows(warned, "checkpoint_failures");
  ASSERT_EQ(saves.size(), 2u);
  EXPECT_EQ(saves[1]["checkpoint_failures"], 2);

  // With room on the disk again the same command resumes nothing (no checkpoint) and completes.
  r = train_tiny(warned, {"checkpoint.every=5", "train.steps=10", "checkpoint.on_error=warn"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(ckpt(warned, 10) + "/manifest.json"));
}

// SIGTERM while the step-5 save is persisting (held 3 s by the fault hook after its first file):
// the run finishes its step, lets that save commit, writes the stop checkpoint, exits 0 with the
// resume line; resuming reproduces the uninterrupted run bit for bit.
TEST(AsyncCheckpoint, PreemptionDuringAnInFlightSaveCommitsItAndTheStopCheckpoint) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("preempted");
  std::string args = "train -c " + source_path("tests/configs/tiny_fashion.yaml") + " --set run.out_dir=" + run +
                     " --set data.path=" + fashion_mnist_dir() +
                     " --set checkpoint.every=5 --set train.steps=100000 --set train.threads=1"
                     " --set debug.allow_inject=true --set debug.inject.checkpoint_pause=5:3";
  const std::string log = run + "/../preempted.log", pid_file = run + "/../preempted.pid";
  std::system((std::string(FLOWTRAIN_BINARY) + " " + args + " > " + log +
               " 2>&1 & echo $! > " + pid_file)
                  .c_str());
  const pid_t pid = std::stoi(read_file(pid_file));
  const std::string partial = ckpt(run, 5) + ".tmp/model.safetensors";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(partial) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(partial)) << read_file(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  // The process is not our child (started through the shell): wait for it to disappear.
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (kill(pid, 0) == 0 && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(kill(pid, 0), 0) << "still running a minute after SIGTERM:\n" << read_file(log);

  const std::string out = read_file(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("stopped at step ([0-9]+); the same command resumes from"))) << out;
  const int stopped_at = std::stoi(m[1].str());
  EXPECT_TRUE(fs::exists(ckpt(run, 5) + "/manifest.json")) << "the in-flight save was abandoned\n" << out;
  EXPECT_TRUE(fs::exists(ckpt(run, stopped_at) + "/manifest.json")) << out;
  EXPECT_FALSE(fs::exists(ckpt(run, 5) + ".tmp"));

  const std::string target = "train.steps=" + std::to_string(stopped_at + 3);
  auto r = train_tiny(run, {"checkpoint.every=5", target, "train.threads=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt(run, stopped_at)), std::string::npos) << r.output;
  const std::string straight = scratch_dir("straight");
  r = train_tiny(straight, {"checkpoint.every=5", target, "train.threads=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_tensor_files(ckpt(straight, stopped_at + 3), ckpt(run, stopped_at + 3));
  const auto a = read_metrics(straight), b = read_metrics(run);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << a[i]["step"];
}
