// flowtrain — the command line. Each subcommand parses its flags, then calls one library entry
// point; every user-facing failure arrives here as a typed exception and leaves as one clear
// error line and a non-zero exit code (2: bad config or usage, 1: anything else).
#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "trainer/telemetry/memory_stats.h"
#include "trainer/telemetry/bench.h"
#include "models/autocast_region.h"
#include "models/model.h"
#include "parallel/env.h"
#include "parallel/launch.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/evaluate.h"
#include "trainer/config/config.h"
#include "trainer/model_registry.h"
#include "trainer/checkpoint/export.h"
#include "trainer/telemetry/run_log.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/trainer.h"
#include "parallel/comm.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

using namespace flowtrain;

namespace {

struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  void add_to(CLI::App* cmd) {
    cmd->add_option("-c,--config", path, "YAML run config (see configs/)")->required()->check(CLI::ExistingFile);
    cmd->add_option("--set", overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
  }
  trainer::Config load() const { return trainer::load_config(path, overrides); }
};

int cmd_config(const ConfigArgs& args) {
  trainer::Config c = args.load();
  const trainer::ModelCost cost = trainer::model_family(c.model.arch).cost(c.model);
  std::printf("# resolved config of %s\n", c.source_path.c_str());
  std::printf("# model: %.3fM parameters (%.2fB), %.4f GFLOP per training sample (3x forward; %ld tokens)\n",
              cost.parameters / 1e6, cost.parameters / 1e9, cost.train_flops_per_sample / 1e9,
              static_cast<long>(cost.tokens_per_sample));
  std::printf("%s\n", trainer::to_yaml(c).c_str());
  return 0;
}

int cmd_sample(const ConfigArgs& args, const std::string& checkpoint, std::string out, double cfg_scale,
               int64_t steps, bool raw) {
  trainer::Config c = args.load();
  if (cfg_scale >= 0) c.sample.cfg_scale = cfg_scale;
  if (steps > 0) c.sample.steps = steps;
  trainer::setup_logging("");
  trainer::configure_threads(c.train);
  const c10::Device device = trainer::select_device(c.run);
  const trainer::CheckpointModel loaded = trainer::load_checkpoint_model(c, checkpoint, raw, device);
  const auto& model = loaded.model;
  at::Tensor samples;
  {
    at::NoGradGuard no_grad;
    models::AutocastRegion autocast(c.train.precision == "bf16", device.type());  // as training samples
    models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& cond) {
      return model->forward(x, t, cond);
    };
    samples = trainer::generate_samples(velocity, *model, loaded.class_conditioning, c.sample, c.flow,
                                        c.model.num_classes, device);
  }
  // One column per class of the data set when the model has more class slots than shown.
  trainer::write_sample_grid(out, samples, std::min<int64_t>(c.model.num_classes, 10));
  spdlog::info("wrote {} ({} samples from {} weights at step {}, {} {} steps, cfg {})", out, c.sample.num,
               loaded.ema ? "EMA" : "raw", loaded.step, c.sample.sampler, c.sample.steps, c.sample.cfg_scale);
  return 0;
}

int cmd_train_classifier(const ConfigArgs& args, bool force) {
  trainer::Config c = args.load();
  trainer::setup_logging("");
  trainer::configure_threads(c.train);
  const c10::Device device = trainer::select_device(c.run);
  const std::string dir = c.eval.classifier_dir.empty() ? trainer::default_classifier_dir() : c.eval.classifier_dir;
  trainer::TrainedClassifier classifier;
  if (force) {
    auto train = data::load_fashion_mnist(c.data.path, "train"), test = data::load_fashion_mnist(c.data.path, "test");
    classifier = trainer::train_classifier(dir, train, test, device);
  } else {
    classifier = trainer::load_or_train_classifier(dir, c.data.path, device);
  }
  std::printf("{\"path\": \"%s\", \"test_accuracy\": %.4f, \"weights_hash\": \"%s\", \"trained_now\": %s}\n",
              classifier.path.c_str(), classifier.test_accuracy, classifier.weights_hash.c_str(),
              classifier.trained_now ? "true" : "false");
  return 0;
}

int cmd_bench(const ConfigArgs& args, const trainer::BenchOptions& options, const std::string& json_path) {
  trainer::Config c = args.load();
  if (options.synthetic) c.data.source = "synthetic";
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
  if (!json_path.empty()) {
    std::FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) throw std::runtime_error("cannot write " + json_path);
    std::fprintf(f, "%s\n", report.to_json().c_str());
    std::fclose(f);
  }
  return 0;
}

// `flowtrain launch [options] -- <subcommand> <args>…`: runs nproc_per_node ranks of this very
// binary (/proc/self/exe, so a relative argv[0] or a changed PATH cannot pick another build).
int cmd_launch(parallel::LaunchOptions options, const std::vector<std::string>& subcommand, bool node_rank_given) {
  auto logger = spdlog::stderr_color_mt("launch");  // stdout belongs to the ranks
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  try {
    if (!subcommand.empty() && subcommand[0] == "launch")
      throw parallel::LaunchError("the command after -- cannot be launch itself");
    if (!node_rank_given && options.nnodes > 1) {
      const auto from_env = parallel::default_node_rank([](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        return v ? std::optional<std::string>(v) : std::nullopt;
      });
      if (!from_env)
        throw parallel::LaunchError(
            "--node-rank is required with --nnodes > 1 (outside a Kubernetes Indexed Job or Slurm step)");
      options.node_rank = *from_env;
    }
    char self[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) throw std::runtime_error("cannot resolve /proc/self/exe");
    options.command = {std::string(self, static_cast<size_t>(n))};
    options.command.insert(options.command.end(), subcommand.begin(), subcommand.end());
    return parallel::launch_local(options);
  } catch (const parallel::LaunchError& e) {
    std::fprintf(stderr, "flowtrain: launch: %s\n", e.what());
    return 2;
  } catch (const parallel::DistEnvError& e) {
    std::fprintf(stderr, "flowtrain: launch: %s\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  trainer::install_memory_tracking();  // before any tensor: peak CPU tensor bytes count from here
  CLI::App app{"flowtrain: native C++ trainer for diffusion transformers (DiT) with flow matching"};
  app.set_version_flag("--version", std::string("flowtrain ") + FLOWTRAIN_VERSION);
  app.require_subcommand(1);

  ConfigArgs train_args, sample_args, config_args;
  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train_args.add_to(train);

  auto* sample = app.add_subcommand("sample", "write a class-conditional sample grid from a checkpoint");
  sample_args.add_to(sample);
  std::string sample_checkpoint, sample_out = "grid.png";
  double sample_cfg = -1;
  int64_t sample_steps = 0;
  bool sample_raw = false;
  sample->add_option("--checkpoint", sample_checkpoint, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();
  sample->add_option("--out", sample_out, "output PNG")->capture_default_str();
  sample->add_option("--cfg-scale", sample_cfg, "classifier-free guidance scale (default: sample.cfg_scale)");
  sample->add_option("--steps", sample_steps, "sampler steps (default: sample.steps)");
  sample->add_flag("--raw", sample_raw, "use the raw weights instead of the EMA weights");

  auto* exporter = app.add_subcommand("export", "write a checkpoint's weights as one safetensors file");
  trainer::ExportOptions export_options;
  exporter->add_option("--checkpoint", export_options.checkpoint_dir, "checkpoint directory")->required();
  exporter->add_option("--out", export_options.out_path, "output .safetensors file")->required();
  exporter->add_flag("--ema", export_options.ema, "export the EMA weights");
  exporter->add_option("--dtype", export_options.dtype, "fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();

  auto* config = app.add_subcommand("config", "print the fully resolved config (defaults filled in)");
  config_args.add_to(config);

  ConfigArgs eval_args;
  std::string eval_checkpoint;
  int64_t eval_num = 0;
  auto* eval = app.add_subcommand("eval", "score a checkpoint's samples: FD, real-vs-real floor, class accuracy, IS");
  eval_args.add_to(eval);
  eval->add_option("--checkpoint", eval_checkpoint, "checkpoint directory")->required();
  eval->add_option("--num", eval_num, "generated samples (default: eval.num)");

  ConfigArgs classifier_args;
  bool classifier_force = false;
  auto* train_classifier = app.add_subcommand(
      "train-classifier", "train (or load from the cache) the Fashion-MNIST classifier that eval uses as its judge");
  classifier_args.add_to(train_classifier);
  train_classifier->add_flag("--force", classifier_force, "retrain even if a valid cached classifier exists");

  ConfigArgs bench_args;
  trainer::BenchOptions bench_options;
  std::string bench_json;
  auto* bench = app.add_subcommand("bench", "time the real training step: step time, samples/s, TFLOP/s, MFU, memory");
  bench_args.add_to(bench);
  bench->add_option("--steps", bench_options.steps, "timed steps (0 with --parity-dump: only write the dump)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--warmup", bench_options.warmup, "untimed warm-up steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  bench->add_flag("--synthetic", bench_options.synthetic, "synthetic data (data.source=synthetic)");
  bench->add_option("--peak-tflops", bench_options.peak_tflops, "MFU denominator per rank, e.g. a GPU's dense peak (default: measured matmul rate)");
  bench->add_option("--json", bench_json, "also write the report as JSON to this file");
  bench->add_option("--parity-dump", bench_options.parity_dump,
                    "write the first step's weights, inputs and loss (safetensors) for bench/compare_pytorch.sh");

  parallel::LaunchOptions launch_options;
  std::vector<std::string> launch_command;
  auto* launch = app.add_subcommand("launch",
                                    "run N ranks of a flowtrain subcommand on this node (like torchrun): "
                                    "launch --nproc-per-node N -- train -c cfg.yaml");
  // Ranges are checked by launch_local, whose messages name the flag and the allowed values.
  launch->add_option("--nproc-per-node", launch_options.nproc_per_node, "ranks on this node (one per GPU)")
      ->capture_default_str();
  launch->add_option("--nnodes", launch_options.nnodes, "nodes in the job")->capture_default_str();
  auto* launch_node_rank = launch->add_option(
      "--node-rank", launch_options.node_rank,
      "this node's index (default with --nnodes > 1: JOB_COMPLETION_INDEX, else SLURM_NODEID)");
  launch->add_option("--master-addr", launch_options.master_addr, "host of rank 0")->capture_default_str();
  launch->add_option("--master-port", launch_options.master_port,
                     "port of rank 0 (default: a free port; required with --nnodes > 1)");
  launch->add_option("--grace-seconds", launch_options.grace_seconds,
                     "after a rank fails: SIGTERM the others, SIGKILL them after this long")
      ->capture_default_str();
  // Everything after `--` lands here untouched (flags such as --set included).
  launch->add_option("command", launch_command, "the flowtrain subcommand and its arguments, after --")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*train) {
      trainer::Trainer t(train_args.load());
      t.run();
      return 0;
    }
    if (*sample) return cmd_sample(sample_args, sample_checkpoint, sample_out, sample_cfg, sample_steps, sample_raw);
    if (*exporter) {
      auto names = trainer::export_checkpoint(export_options);
      std::fprintf(stderr, "exported %zu tensors to %s\n", names.size(), export_options.out_path.c_str());
      return 0;
    }
    if (*config) return cmd_config(config_args);
    if (*bench) return cmd_bench(bench_args, bench_options, bench_json);
    if (*eval) {
      trainer::Config c = eval_args.load();
      trainer::setup_logging("");
      trainer::configure_threads(c.train);
      trainer::QualityReport report = trainer::evaluate_checkpoint(c, eval_checkpoint, eval_num);
      std::printf("%s\n", report.to_json().c_str());
      return 0;
    }
    if (*train_classifier) return cmd_train_classifier(classifier_args, classifier_force);
    if (*launch) return cmd_launch(launch_options, launch_command, launch_node_rank->count() > 0);
  } catch (const trainer::ConfigError& e) {
    std::fprintf(stderr, "flowtrain: config error: %s\n", e.what());
    return 2;
  } catch (const parallel::DistEnvError& e) {
    std::fprintf(stderr, "flowtrain: launch environment error: %s\n", e.what());
    return 2;
  } catch (const parallel::CommError& e) {
    std::fprintf(stderr, "flowtrain: distributed failure (a peer died, hung or disagreed): %s\n", e.what());
    return 1;
  } catch (const data::DataError& e) {
    std::fprintf(stderr, "flowtrain: data error: %s\n", e.what());
    return 1;
  } catch (const trainer::CheckpointError& e) {
    std::fprintf(stderr, "flowtrain: checkpoint error: %s\n", e.what());
    return 1;
  } catch (const trainer::TrainingError& e) {
    std::fprintf(stderr, "flowtrain: training stopped: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flowtrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
