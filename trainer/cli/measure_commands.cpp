// flowtrain bench | numerics: the training step's speed and memory, fp8's numerics.
#include "models/fp8/recipe.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/cli/command.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/family.h"
#include "trainer/first_micro_batch.h"
#include "trainer/fp8_numerics.h"
#include "trainer/telemetry/bench.h"
#include "trainer/telemetry/data_bench.h"
#include "trainer/telemetry/run_log.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

namespace flowtrain::cli {

namespace {

struct NumericsArgs {
  std::string checkpoint, json;
  std::vector<std::string> recipes;
};

// `flowtrain numerics`: trainer/fp8_numerics.h on the config's first training micro-batch.
int cmd_numerics(const ConfigArgs& args, NumericsArgs a) {
  trainer::Config c = args.load();
  trainer::setup_logging("");
  trainer::configure_threads(c.train);
  const c10::Device device = trainer::select_device(c.run);
  if (a.recipes.empty())
    for (const auto& r : models::fp8::recipe_names())
      if (r != "none") a.recipes.push_back(r);
  std::shared_ptr<models::DiffusionModel> model;
  if (!a.checkpoint.empty()) {
    // The raw weights: the ones training computes with (the EMA never runs a training step).
    model = trainer::load_checkpoint_model(c, a.checkpoint, /*raw=*/true, device).model;
    model->train();
  } else {
    spdlog::warn("numerics: no --checkpoint, so the fresh initialisation of run.seed: its adaLN-Zero blocks pass no "
                 "gradient yet (gradient SQNRs are null); give a checkpoint for a trained model's figures");
    at::manual_seed(static_cast<uint64_t>(c.run.seed));
    model = trainer::model_family(c.model.arch).build(c.model);
    model->to(device);
  }
  const trainer::FirstMicroBatch batch = trainer::first_micro_batch(c, *model);
  const trainer::NumericsReport report = trainer::fp8_numerics(c, *model, batch, a.recipes, device);
  std::printf("%s", report.to_table().c_str());
  if (!a.json.empty()) trainer::write_file_atomic(a.json, report.to_json() + "\n");
  return 0;
}

int cmd_bench(const ConfigArgs& args, const trainer::BenchOptions& options, const std::string& json_path) {
  trainer::Config c = args.load();
  if (options.synthetic) c.data.source = trainer::DataSource::synthetic;
  trainer::setup_logging("");
  if (!options.parity_dump.empty()) {
    trainer::configure_threads(c.train);
    const double loss = trainer::write_parity_dump(c, options.parity_dump);
    spdlog::info("parity dump {} (first-step loss {:.8f})", options.parity_dump, loss);
    // Only the dump: a timed run in the same process would carry the dump's model and batch in
    // its peak memory (bench/compare_pytorch.sh times in processes of their own).
    if (options.steps == 0) return 0;
  }
  if (options.steps < 1) throw trainer::ConfigError("--steps must be >= 1 (0 only with --parity-dump)");
  trainer::BenchReport report = trainer::run_benchmark(c, options);
  std::printf("%s\n", report.to_table().c_str());
  // One writer: every rank of a multi-rank bench holds the per-rank peaks (all-gathered), and
  // ranks writing the same path at once interleave their bytes into invalid JSON.
  if (!json_path.empty() && report.rank == 0) trainer::write_file_atomic(json_path, report.to_json() + "\n");
  return 0;
}

}  // namespace

std::vector<Command> add_measure_commands(CLI::App& app) {
  std::vector<Command> commands;

  struct BenchArgs {
    ConfigArgs config;
    trainer::BenchOptions options;
    std::string json;
    bool data_only = false;
  };
  auto b = std::make_shared<BenchArgs>();
  auto* bench = app.add_subcommand("bench", "time the real training step: step time, samples/s, TFLOP/s, MFU, memory");
  b->config.add_to(bench);
  bench->add_option("--steps", b->options.steps, "timed steps (0 with --parity-dump: only write the dump)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--warmup", b->options.warmup, "untimed warm-up steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bench->add_flag("--synthetic", b->options.synthetic, "synthetic data (data.source=synthetic)");
  bench->add_option("--peak-tflops", b->options.peak_tflops,
                    "MFU denominator per rank, e.g. a GPU's dense peak (default: measured matmul rate)");
  bench->add_option("--json", b->json, "also write the report as JSON to this file");
  bench->add_flag("--data-only", b->data_only,
                  "time only the data loader (data.workers threads, --steps batches after --warmup): samples/s, MB/s");
  bench->add_flag("--checkpoint", b->options.checkpoint,
                  "also measure a save's cost: the run twice, saving synchronously then asynchronously "
                  "(checkpoint_sync_s, checkpoint_blocked_s, checkpoint_persist_s, step times overlapping a persist)");
  bench->add_option("--checkpoint-every", b->options.checkpoint_every, "steps between saves (default: steps / 3)")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--parity-dump", b->options.parity_dump,
                    "write the first step's weights, inputs and loss (safetensors) for bench/compare_pytorch.sh");
  commands.push_back({bench, [b] {
                        if (!b->data_only) return cmd_bench(b->config, b->options, b->json);
                        trainer::Config c = b->config.load();
                        trainer::setup_logging("");
                        const auto report = trainer::run_data_bench(c, b->options.steps, b->options.warmup);
                        std::printf("%s\n", report.to_table().c_str());
                        if (!b->json.empty()) trainer::write_file_atomic(b->json, report.to_json() + "\n");
                        return 0;
                      }});

  struct NumericsCommand {
    ConfigArgs config;
    NumericsArgs options;
  };
  auto n = std::make_shared<NumericsCommand>();
  auto* numerics = app.add_subcommand(
      "numerics", "fp8 numerics of one real batch, per recipe: each converted linear's SQNR of output, grad_input and "
                  "grad_weight against float64, input amax, saturated and underflowed fractions; the whole model's "
                  "loss and gradient-norm differences against fp32");
  n->config.add_to(numerics);
  numerics->add_option("--checkpoint", n->options.checkpoint,
                       "checkpoint directory (its raw weights; default: the fresh initialisation)");
  numerics->add_option("--recipe", n->options.recipes, "recipe to measure (repeatable; default: all)")
      ->check(CLI::IsMember(models::fp8::recipe_names()));
  numerics->add_option("--json", n->options.json, "also write the report as JSON to this file");
  commands.push_back({numerics, [n] { return cmd_numerics(n->config, n->options); }});
  return commands;
}

}  // namespace flowtrain::cli
