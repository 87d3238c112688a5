// End to end through the CLI on the real Fashion-MNIST data: training makes progress, a resumed
// or crash-recovered run reproduces the uninterrupted one bit for bit, exports load by name.
#include "cli_runner.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <fstream>
#include <set>
#include <thread>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {


void expect_same_files(const std::string& a, const std::string& b) {
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(read_file(a + "/" + f), read_file(b + "/" + f)) << f << " differs between " << a << " and " << b;
  }
}

void expect_same_metrics(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    for (const char* key : {"loss", "grad_norm", "lr"}) EXPECT_EQ(a[i][key], b[i][key]) << key << " at row " << i;
  }
}

}  // namespace

TEST(TrainCli, TinyConfigTrainsFiftyStepsAndLossFalls) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("run");
  auto r = train_tiny(run, {"sample.every=50"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 50u);
  for (const char* key : {"step", "loss", "grad_norm", "lr", "samples_per_s", "step_time_s"})
    EXPECT_TRUE(rows[0].contains(key)) << key;
  const double first = mean_loss(rows, 0, 10), last = mean_loss(rows, 40, 50);
  // The zero-initialised model starts at E[(ε − x0)²] ≈ 1.6; 50 steps of a tiny DiT reach ~0.6.
  // Requiring a 30% drop leaves a wide margin for seeds while failing on a model that does not learn.
  EXPECT_LT(last, 0.7 * first) << "first 10 steps " << first << ", last 10 " << last;
  EXPECT_GT(first, 1.0);
  EXPECT_TRUE(fs::exists(run + "/samples/step-0000050.png"));
  EXPECT_TRUE(fs::exists(ckpt(run, 50) + "/manifest.json"));  // final checkpoint even with every: 0
  EXPECT_NE(read_file(run + "/log.txt").find("step 50/50"), std::string::npos);
  // the resolved config is itself a valid config
  auto again = run_flowtrain("config -c " + run + "/config.yaml");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

// 20 steps straight; 10 steps then resume to 20; and a run SIGKILLed while writing its step-10
// checkpoint, resumed from step 5. All three must end with byte-identical weights, EMA and
// optimizer state, and identical loss / grad-norm / lr for every step.
TEST(TrainCli, ResumeAndCrashRecoveryReproduceTheStraightRunBitForBit) {
  REQUIRE_DATA();
  const std::vector<std::string> every5 = {"checkpoint.every=5", "train.steps=20"};
  const std::string straight = scratch_dir("straight");
  auto r = train_tiny(straight, every5);
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string resumed = scratch_dir("resumed");
  r = train_tiny(resumed, {"checkpoint.every=5", "train.steps=10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train_tiny(resumed, every5);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt(resumed, 10)), std::string::npos) << r.output;
  expect_same_files(ckpt(straight, 20), ckpt(resumed, 20));
  expect_same_metrics(read_metrics(straight), read_metrics(resumed));

  // The crashes: the fault-injection hook pauses after the first file of step 10's checkpoint
  // (between two files), or first cuts that file to half its bytes (a kill inside its write).
  for (const std::string mode : {"", ":torn"}) {
    const std::string crashed = scratch_dir("crashed" + (mode.empty() ? std::string() : "_torn"));
    std::string args = "train -c " + source_path("tests/configs/tiny_fashion.yaml") + " --set run.out_dir=" + crashed +
                       " --set data.path=" + fashion_mnist_dir();
    for (const auto& s : every5) args += " --set " + s;
    const std::string pid_file = crashed + "/../crashed.pid", log = crashed + "/../crashed.log";
    args += " --set debug.allow_inject=true --set debug.inject.checkpoint_pause=10:120" + mode;
    std::system((std::string(FLOWTRAIN_BINARY) + " " + args +
                 " > " + log + " 2>&1 & echo $! > " + pid_file)
                    .c_str());
    const pid_t pid = std::stoi(read_file(pid_file));
    const std::string partial = crashed + "/checkpoints/step-0000010.tmp/model.safetensors";
    // The torn mode writes the whole file, then cuts it: wait until the cut is done (the log
    // cannot tell, so wait for the size to stop being the full one, ~0.2 MB here).
    auto ready = [&] {
      if (!fs::exists(partial)) return false;
      return mode.empty() || fs::file_size(partial) < fs::file_size(ckpt(straight, 10) + "/model.safetensors");
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!ready() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(ready()) << read_file(log);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(fs::exists(ckpt(crashed, 10))) << "a half-written checkpoint looks complete" << mode;
    EXPECT_TRUE(fs::exists(ckpt(crashed, 5) + "/manifest.json"));

    r = train_tiny(crashed, every5);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from " + ckpt(crashed, 5)), std::string::npos) << mode << r.output;
    EXPECT_FALSE(fs::exists(crashed + "/checkpoints/step-0000010.tmp"));  // leftovers cleaned
    expect_same_files(ckpt(straight, 20), ckpt(crashed, 20));
    expect_same_metrics(read_metrics(straight), read_metrics(crashed));
  }
}

TEST(TrainCli, ExportUsesReferenceKeyNamesAndSampleWritesAGrid) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("run");
  auto r = train_tiny(run, {"train.steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string out = run + "/export.safetensors";
  r = run_flowtrain("export --checkpoint " + ckpt(run, 3) + " --out " + out + " --ema --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  flowtrain::data::SafetensorsReader reader(out);
  std::set<std::string> keys(reader.keys().begin(), reader.keys().end());
  for (const char* k : {"x_embedder.proj.weight", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.bias",
                        "y_embedder.embedding_table.weight", "pos_embed", "blocks.0.attn.qkv.weight",
                        "blocks.1.attn.proj.bias", "blocks.1.mlp.fc1.weight", "blocks.0.mlp.fc2.bias",
                        "blocks.1.adaLN_modulation.1.weight", "final_layer.linear.weight",
                        "final_layer.adaLN_modulation.1.bias"})
    EXPECT_TRUE(keys.count(k)) << k;
  EXPECT_EQ(keys.size(), 4u + 2 + 2 + 2 * 10 + 4);  // embedders 7 + pos + blocks + final
  EXPECT_EQ(reader.dtype("blocks.0.attn.qkv.weight"), at::kBFloat16);
  EXPECT_EQ(reader.shape("y_embedder.embedding_table.weight"), (std::vector<int64_t>{11, 64}));
  EXPECT_EQ(reader.metadata().at("weights"), "ema");

  const std::string grid = run + "/grid.png";
  r = run_flowtrain("sample -c " + source_path("tests/configs/tiny_fashion.yaml") + " --checkpoint " + ckpt(run, 3) +
                    " --out " + grid + " --steps 2 --cfg-scale 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  at::Tensor png = flowtrain::data::read_png(grid);
  // 20 samples of 28×28 in rows of 10 with 2 px padding: 2 rows → 2 + 2·30 high, 2 + 10·30 wide
  EXPECT_EQ(png.size(0), 62);
  EXPECT_EQ(png.size(1), 302);
}

TEST(TrainCli, BadInputGivesOneClearErrorAndWritesNothing) {
  const std::string run = scratch_dir("run");
  auto r = train_tiny(run + "/a", {"optim.lrr=0.1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown key 'optim.lrr' (did you mean 'optim.lr'?)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run + "/a"));

  r = train_tiny(run + "/b", {"data.path=" + run + "/nowhere"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(run + "/nowhere"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;

  // a truncated image file names the file and the expected size
  REQUIRE_DATA();
  const std::string data = run + "/data";
  fs::create_directories(data);
  fs::copy(fashion_mnist_dir() + "/train-labels-idx1-ubyte.gz", data);
  const std::string images = read_file(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz");
  write_file(data + "/train-images-idx3-ubyte.gz", images.substr(0, images.size() / 2));
  r = train_tiny(run + "/c", {"data.path=" + data});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train-images-idx3-ubyte.gz"), std::string::npos) << r.output;

  r = train_tiny(run + "/d", {"checkpoint.resume=" + run + "/no-such-checkpoint"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no such checkpoint"), std::string::npos) << r.output;
}

// Telemetry of a run: TensorBoard events beside metrics.jsonl, and a Kineto trace of exactly the
// configured step window with the trainer's named phases.
TEST(TrainCli, WritesTensorBoardEventsAndAProfileTrace) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("run");
  auto r = train_tiny(run, {"train.steps=5", "profile.enabled=true", "profile.start_step=2", "profile.num_steps=2",
                            "sample.every=5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(run + "/tb")) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].filename().string().find("events.out.tfevents."), std::string::npos);
  const std::string tb = read_file(events[0].string());
  for (const char* tag : {"brain.Event:2", "loss", "grad_norm", "samples_per_s", "samples"})
    EXPECT_NE(tb.find(tag), std::string::npos) << tag;
  const auto trace = nlohmann::json::parse(read_file(run + "/profiles/rank-0-step-2.json"));
  std::map<std::string, int> phases;
  for (const auto& e : trace["traceEvents"])
    if (e.contains("name") && e["name"].is_string()) phases[e["name"].get<std::string>()] += 1;
  for (const char* phase : {"data_wait", "forward", "backward", "optimizer"}) EXPECT_EQ(phases[phase], 2) << phase;
  EXPECT_EQ(chrome_trace_problems(trace), "");  // what Perfetto's JSON importer needs
}

// flowtrain eval on a checkpoint prints the quality report (the classifier is trained on first
// use into the shared test cache, or loaded from it).
TEST(TrainCli, EvalReportsQualityMetricsAsJson) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("run");
  auto r = train_tiny(run, {"train.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string cache = std::string(FLOWTRAIN_TEST_TMP) + "/classifier-cache";
  r = run_flowtrain("eval -c " + source_path("tests/configs/tiny_fashion.yaml") + " --checkpoint " + ckpt(run, 2) +
                    " --num 100 --set eval.steps=2 --set eval.classifier_dir=" + cache +
                    " --set data.path=" + fashion_mnist_dir());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string json_line = r.output.substr(r.output.rfind("{\"fd\""));
  const auto report = nlohmann::json::parse(json_line);
  for (const char* key : {"fd", "fd_floor", "class_accuracy", "inception_score", "classifier_test_accuracy", "num"})
    EXPECT_TRUE(report.contains(key)) << key;
  EXPECT_EQ(report["num"], 100);
  EXPECT_GE(report["classifier_test_accuracy"].get<double>(), 0.9);
  // two steps of training cannot make samples look like garments: far above the real floor
  EXPECT_GT(report["fd"].get<double>(), 5 * report["fd_floor"].get<double>());
  // The held-out loss after two steps is still near the zero model's E[(ε − x0)²] ≈ 1 + E[x0²]
  // (mostly black background: x0 ≈ −1), ~1.6–1.7; a trained default model reaches ~0.28.
  ASSERT_TRUE(report.contains("val_loss"));
  EXPECT_GT(report["val_loss"].get<double>(), 1.0);
  EXPECT_LT(report["val_loss"].get<double>(), 2.5);
  EXPECT_TRUE(fs::exists(ckpt(run, 2) + "/eval.json"));
}

TEST(TraceCheck, AcceptsNestedSlicesAndFlagsWhatPerfettoWouldReject) {
  auto trace = [](const char* events) { return nlohmann::json::parse(std::string("{\"traceEvents\": ") + events + "}"); };
  EXPECT_EQ(chrome_trace_problems(trace(R"([{"ph":"X","name":"a","ts":0,"dur":10,"pid":1,"tid":1},
                                             {"ph":"X","name":"b","ts":2,"dur":5,"pid":1,"tid":1},
                                             {"ph":"X","name":"c","ts":5,"dur":20,"pid":1,"tid":2}])")),
            "");
  EXPECT_NE(chrome_trace_problems(trace(R"([{"ph":"X","name":"a","ts":0,"dur":10,"pid":1,"tid":1},
                                             {"ph":"X","name":"b","ts":5,"dur":10,"pid":1,"tid":1}])")),
            "");
  EXPECT_NE(chrome_trace_problems(trace(R"([{"ph":"X","name":"a","ts":0,"pid":1,"tid":1}])")), "");
  EXPECT_NE(chrome_trace_problems(nlohmann::json::parse("{}")), "");
}

// `flowtrain config` prints what a config resolves to (here, and for a planned world), and a plan
// that breaks a rule exits 2 with the rule's error before anything runs.
TEST(ConfigCli, PrintsWhatTheConfigResolvesToAndRefusesABrokenPlan) {
  const std::string config = source_path("configs/fashion_dit.yaml");
  auto r = run_flowtrain("config -c " + config + " --gpus 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"#   device    cpu", "#   sharding  none (one process)",
                           "#   batch     global 128 = 1 data-parallel rank × 1 micro-batch × 128 samples",
                           "#   model     hidden 128, depth 6, heads 4", "\nrun:\n"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;

  r = run_flowtrain("config -c " + config + " --world 16 --ranks-per-node 8 --gpus 8 --set parallel.dp_replicate=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"# for world 16 (8 per machine), 8 GPUs", "#   device    cuda",
                           "#   mesh      dp_replicate 2 × dp_shard 8 × cp 1 (16 data-parallel ranks)",
                           "#   sharding  FSDP over the mesh, nccl collectives",
                           "#   batch     global 128 = 16 data-parallel ranks × 1 micro-batch × 8 samples"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;

  r = run_flowtrain("config -c " + config + " --world 48");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'data.batch_size' (128) must be divisible by 48 data-parallel ranks"), std::string::npos)
      << r.output;

  // The FLUX.1 configs a user starts from resolve for 8 and 64 GPUs (their weight files are not
  // read here): the schnell fine-tune and FLUX.1-dev (its guidance embedding: 10.2M more
  // parameters than schnell, as the releases).
  for (const auto& [file, parameters] : {std::pair<std::string, std::string>{"flux_schnell_finetune", "11891.179M"},
                                         {"flux_dev", "11901.408M"}})
    for (const char* world : {"8", "64"}) {
      r = run_flowtrain("config -c " + source_path("configs/" + file + ".yaml") + " --world " + world +
                        " --ranks-per-node 8 --gpus 8");
      ASSERT_EQ(r.exit_code, 0) << file << "\n" << r.output;
      EXPECT_NE(r.output.find("# model: " + parameters + " parameters"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("#   sharding  FSDP over the mesh, nccl collectives"), std::string::npos) << r.output;
      // The per-rank memory estimate from the FSDP plan (checked against measured peaks in
      // tests/dist/test_memory_estimate.cpp); the frozen encoders' files are not here.
      EXPECT_NE(r.output.find("#   memory    "), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("frozen encoders not counted: their files are not here"), std::string::npos) << r.output;
    }
}
