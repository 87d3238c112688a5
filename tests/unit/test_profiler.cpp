// StepProfiler: a Kineto trace of exactly the configured step window, with the named ranges in
// it, written as Chrome trace JSON (what Perfetto opens). Runs on the CPU; a CUDA trace is
// checked by the gpu tests.
#include "test_util.h"
#include "trainer/telemetry/profiler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace flowtrain::trainer {
namespace {

namespace fs = std::filesystem;

// One fake training step with the ranges the trainer opens.
void fake_step(const at::Tensor& w) {
  at::Tensor x;
  {
    ProfileRange range("data_wait");
    x = at::ones({16, 32});
  }
  at::Tensor y;
  {
    ProfileRange range("forward");
    y = at::mm(x, w).relu();
  }
  {
    ProfileRange range("backward");
    y = at::mm(y, w.t());
  }
  {
    ProfileRange range("optimizer");
    w.add_(at::mm(x.t(), y).mul(-1e-6));
  }
}

// Counts trace events with this name, of any phase ("X" spans, "i" instants, …).
int64_t count_named(const nlohmann::json& trace, const std::string& name) {
  int64_t n = 0;
  for (const auto& e : trace.at("traceEvents"))
    if (e.is_object() && e.value("name", "") == name) ++n;
  return n;
}

TEST(ProfilerTest, TracesExactlyTheConfiguredSteps) {
  const std::string out = test::scratch_dir("run");
  ProfileConfig config;
  config.enabled = true;
  config.start_step = 2;
  config.num_steps = 2;
  config.record_shapes = true;
  const at::Tensor w = at::randn({32, 32});
  const std::string path = out + "/profiles/rank-0-step-2.json";
  {
    StepProfiler profiler(config, out, /*rank=*/0, /*cuda=*/false);
    EXPECT_EQ(profiler.trace_path(), path);
    for (int64_t step = 1; step <= 4; ++step) {
      profiler.step_begin(step);
      EXPECT_EQ(profiler.running(), step == 2 || step == 3) << "step " << step;
      fake_step(w);
      profiler.step_end(step);
      // Saved as soon as the window ends, not at destruction.
      EXPECT_EQ(fs::exists(path), step >= 3) << "step " << step;
    }
    EXPECT_FALSE(profiler.running());
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  ASSERT_TRUE(fs::exists(path));

  const nlohmann::json trace = nlohmann::json::parse(test::read_file(path));
  ASSERT_TRUE(trace.contains("traceEvents"));
  ASSERT_TRUE(trace.at("traceEvents").is_array());
  // Steps 2 and 3 only: two of each range, and the ops inside them.
  for (const char* name : {"data_wait", "forward", "backward", "optimizer"}) EXPECT_EQ(count_named(trace, name), 2) << name;
  EXPECT_EQ(count_named(trace, "aten::mm"), 2 * 3);  // forward, backward, optimizer
  // Ranges are complete spans in the user-annotation track, as Python's record_function makes.
  for (const auto& e : trace.at("traceEvents"))
    if (e.is_object() && e.value("name", "") == "forward") {
      EXPECT_EQ(e.value("ph", ""), "X");
      EXPECT_EQ(e.value("cat", ""), "user_annotation");
      EXPECT_GT(e.value("dur", 0.0), 0.0);
    }
}

TEST(ProfilerTest, SavesAWindowCutShortByTheRunEnding) {
  const std::string out = test::scratch_dir("run");
  ProfileConfig config;
  config.enabled = true;
  config.start_step = 1;
  config.num_steps = 10;
  config.memory = true;
  const at::Tensor w = at::randn({32, 32});
  {
    StepProfiler profiler(config, out, /*rank=*/3, /*cuda=*/false);
    for (int64_t step = 1; step <= 2; ++step) {
      profiler.step_begin(step);
      fake_step(w);
      profiler.step_end(step);
    }
    EXPECT_TRUE(profiler.running());
  }
  const std::string path = out + "/profiles/rank-3-step-1.json";
  ASSERT_TRUE(fs::exists(path));
  const nlohmann::json trace = nlohmann::json::parse(test::read_file(path));
  EXPECT_EQ(count_named(trace, "forward"), 2);
  EXPECT_GT(count_named(trace, "[memory]"), 0);  // profile.memory: allocation events
}

TEST(ProfilerTest, DisabledOrOutsideTheWindowDoesNothing) {
  const std::string out = test::scratch_dir("run");
  const at::Tensor w = at::randn({32, 32});
  ProfileConfig off;  // enabled = false
  off.start_step = 1;
  ProfileConfig resumed_past;  // a resumed run that starts after the window
  resumed_past.enabled = true;
  resumed_past.start_step = 2;
  for (const ProfileConfig& config : {off, resumed_past}) {
    StepProfiler profiler(config, out, 0, false);
    for (int64_t step = 3; step <= 5; ++step) {
      profiler.step_begin(step);
      fake_step(w);  // ranges with no profiler running are no-ops
      profiler.step_end(step);
      EXPECT_FALSE(profiler.running());
    }
  }
  EXPECT_FALSE(fs::exists(out + "/profiles"));
}

}  // namespace
}  // namespace flowtrain::trainer
