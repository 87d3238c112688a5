// flowtrain — the command line. Each subcommand parses its flags, then calls one library entry
// point; every user-facing failure arrives here as a typed exception and leaves as one clear
// error line and a non-zero exit code (2: bad config or usage, 1: anything else).
#include "data/data_error.h"
#include "data/compositions.h"
#include "data/fashion_mnist.h"
#include "data/png.h"
#include "data/shards/pack.h"
#include "data/shards/shard_inspect.h"
#include "data/safetensors.h"
#include "trainer/eval/motion_following.h"
#include "trainer/eval/prompt_following.h"
#include "trainer/run_conditioning.h"
#include "trainer/telemetry/memory_stats.h"
#include "trainer/telemetry/bench.h"
#include "trainer/telemetry/data_bench.h"
#include "models/autocast_region.h"
#include "models/model.h"
#include "parallel/env.h"
#include "parallel/launch.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/first_micro_batch.h"
#include "trainer/fp8_numerics.h"
#include "models/fp8/recipe.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/evaluate.h"
#include "trainer/config/config.h"
#include "trainer/family.h"
#include "trainer/checkpoint/export.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/checkpoint/inspect.h"
#include "trainer/telemetry/run_log.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/trainer.h"
#include "parallel/comm.h"

#include <CLI/CLI.hpp>

#include <csignal>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
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
  const int64_t transformer = cost.parameters - cost.text_encoder_parameters;
  std::printf("# model: %.3fM parameters (%.2fB)", transformer / 1e6, transformer / 1e9);
  if (cost.text_encoder_parameters > 0)  // the transformer's count first: the figure its references quote
    std::printf(" + built-in text encoder %.3fM (%.2fB)", cost.text_encoder_parameters / 1e6,
                cost.text_encoder_parameters / 1e9);
  std::printf(", %.4f GFLOP per training sample (3x forward; %ld tokens)\n", cost.train_flops_per_sample / 1e9,
              static_cast<long>(cost.tokens_per_sample));
  std::printf("%s\n", trainer::to_yaml(c).c_str());
  return 0;
}

struct SampleArgs {
  std::string checkpoint, out;
  double cfg_scale = -1;
  int64_t steps = 0, seed = -1, per_prompt = 1;
  bool raw = false;
  std::vector<std::string> prompts;  // --prompt, repeatable
  std::string prompts_file;          // --prompts
  std::string dump_inputs;           // --dump-inputs
};

std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw data::DataError(fmt::format("{}: cannot open the prompts file", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);  // an empty line: the unconditional prompt
  if (lines.empty()) throw data::DataError(fmt::format("{}: no prompts", path));
  return lines;
}

int cmd_sample(const ConfigArgs& args, SampleArgs a) {
  trainer::Config c = args.load();
  if (a.cfg_scale >= 0) c.sample.cfg_scale = a.cfg_scale;
  if (a.steps > 0) c.sample.steps = a.steps;
  if (a.seed >= 0) c.sample.seed = a.seed;
  const bool from_prompts = !a.prompts.empty() || !a.prompts_file.empty();
  if (!a.prompts.empty() && !a.prompts_file.empty()) throw trainer::ConfigError("give --prompt or --prompts, not both");
  if (a.per_prompt < 1) throw trainer::ConfigError("--per-prompt must be >= 1");
  if (from_prompts && !trainer::reads_caption_tokens(c.model))
    throw trainer::ConfigError(fmt::format("--prompt / --prompts need a model that reads captions through its own text "
                                           "encoder (model.text_encoder_layers > 0); this config's model.arch {} does "
                                           "not",
                                           c.model.arch));
  const trainer::FamilySpec& family = trainer::model_family(c.model.arch);
  if (!a.dump_inputs.empty() && !family.dump_reference_inputs)
    throw trainer::ConfigError(fmt::format(
        "--dump-inputs writes the inputs of a reference implementation's forward; model.arch {} has none (those that "
        "do: {})",
        c.model.arch,
        fmt::join(trainer::arch_names_where([](const trainer::FamilySpec& f) { return bool(f.dump_reference_inputs); }),
                  "|")));
  trainer::setup_logging("");
  trainer::configure_threads(c.train);
  const c10::Device device = trainer::select_device(c.run);
  const trainer::CheckpointModel loaded = trainer::load_checkpoint_model(c, a.checkpoint, a.raw, device);
  auto& model = *loaded.model;

  trainer::RowConditioning rows = loaded.conditioning.of_rows;
  int64_t num = c.sample.num, columns = loaded.conditioning.grid_columns;
  std::vector<std::string> prompts = a.prompts;
  if (from_prompts) {
    if (!a.prompts_file.empty()) prompts = read_prompt_lines(a.prompts_file);
    auto cond = std::make_shared<models::Conditioning>(
        trainer::prompt_conditioning(c, *trainer::data_tokenizer(c), prompts));
    const int64_t k = a.per_prompt;
    rows = [cond, k](const at::Tensor& r) { return cond->index_select(at::div(r, k, "floor")); };
    num = static_cast<int64_t>(prompts.size()) * k;
    columns = k;
  }
  const models::SamplerOptions so =
      trainer::sampler_options(c.sample.sampler, c.sample.steps, c.sample.cfg_scale, trainer::time_shift(c));
  at::Tensor samples;
  {
    at::NoGradGuard no_grad;
    models::AutocastRegion autocast(c.train.bf16_autocast(), device.type());  // as training samples
    if (!a.dump_inputs.empty()) {
      const at::Tensor noise = trainer::sample_noise(model, num, c.sample.seed).to(device);
      family.dump_reference_inputs(a.dump_inputs, model, noise, rows(at::arange(num, at::kLong)).to(device), so);
    }
    models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& cond) {
      return model.forward(x, t, cond);
    };
    // In chunks of the one draw, so a long --prompts file needs no more memory than a chunk.
    constexpr int64_t kChunk = 256;
    std::vector<at::Tensor> chunks;
    for (int64_t first = 0; first < num; first += kChunk)
      chunks.push_back(trainer::sample_rows(velocity, model, rows, num, c.sample.seed, so, device, first,
                                            std::min(kChunk, num - first)));
    samples = at::cat(chunks);
  }
  if (!a.prompts_file.empty()) {  // one PNG per sample: line i, sample k -> (i·K + k).png
    const std::string dir = a.out.empty() ? "samples" : a.out;
    std::filesystem::create_directories(dir);
    const at::Tensor images = samples.clamp(-1, 1).add(1).mul(127.5).round().to(at::kByte);
    for (int64_t i = 0; i < num; ++i)
      data::write_png((std::filesystem::path(dir) / fmt::format("{:05d}.png", i)).string(),
                      images.size(1) == 1 ? images[i][0] : images[i].permute({1, 2, 0}).contiguous());
    spdlog::info("wrote {} PNGs to {} ({} prompts × {}, {} weights at step {}, {} {} steps, cfg {}, seed {})", num, dir,
                 prompts.size(), a.per_prompt, loaded.ema ? "EMA" : "raw", loaded.step, c.sample.sampler,
                 c.sample.steps, c.sample.cfg_scale, c.sample.seed);
    return 0;
  }
  const std::string out = a.out.empty() ? "grid.png" : a.out;
  trainer::write_sample_grid(out, samples, columns, trainer::sample_video_fps(c));
  spdlog::info("wrote {} ({} samples from {} weights at step {}, {} {} steps, cfg {})", out, num,
               loaded.ema ? "EMA" : "raw", loaded.step, c.sample.sampler, c.sample.steps, c.sample.cfg_scale);
  return 0;
}

int cmd_make_compositions(data::CompositionsOptions o) {
  trainer::setup_logging("");
  const auto t0 = std::chrono::steady_clock::now();
  data::make_compositions(o);
  spdlog::info("wrote {} ({} training canvases, {} evaluation prompts, seed {}) in {:.1f} s", o.out_dir, o.num_train,
               o.num_eval, o.seed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
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

int cmd_verify_checkpoint(const std::string& dir) {
  const std::string problem = trainer::verify_checkpoint(dir);
  if (!problem.empty()) {
    std::fprintf(stderr, "flowtrain: checkpoint verify: %s\n", problem.c_str());
    return 1;
  }
  const auto manifest = trainer::read_checkpoint_manifest(dir);
  std::printf("%s: %zu files match the manifest's sizes and CRC-32s (step %lld)\n", dir.c_str(),
              manifest["files"].size(), static_cast<long long>(manifest.value("step", int64_t{-1})));
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
  // One writer: every rank of a multi-rank bench holds the per-rank peaks (all-gathered), and
  // ranks writing the same path at once interleave their bytes into invalid JSON.
  if (!json_path.empty() && report.rank == 0) trainer::write_file_atomic(json_path, report.to_json() + "\n");
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
  // Past a file-size limit (ulimit -f) a write fails with EFBIG instead of killing the process:
  // a checkpoint that cannot be written is an error the run reports (checkpoint.on_error).
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"flowtrain: native C++ trainer for diffusion transformers with flow matching"};
  app.set_version_flag("--version", std::string("flowtrain ") + FLOWTRAIN_VERSION);
  app.require_subcommand(1);

  ConfigArgs train_args, sample_args, config_args;
  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train_args.add_to(train);
  std::string init_from;
  train->add_option("--init-from", init_from,
                    "initial weights: a safetensors file with the reference key names (= --set train.init_from=FILE)");

  auto* sample = app.add_subcommand("sample", "write samples of a checkpoint: a grid (classes, evaluation prompts or "
                                              "--prompt), or one PNG per line of --prompts");
  sample_args.add_to(sample);
  SampleArgs sample_options;
  sample->add_option("--checkpoint", sample_options.checkpoint, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();
  sample->add_option("--out", sample_options.out, "output PNG (grid.png), or the directory of --prompts (samples)");
  sample->add_option("--cfg-scale", sample_options.cfg_scale, "classifier-free guidance scale (default: sample.cfg_scale)");
  sample->add_option("--steps", sample_options.steps, "sampler steps (default: sample.steps)");
  sample->add_option("--seed", sample_options.seed, "noise seed (default: sample.seed)");
  sample->add_flag("--raw", sample_options.raw, "use the raw weights instead of the EMA weights");
  sample->add_option("--prompt", sample_options.prompts, "a text prompt (repeatable): one grid row per prompt");
  sample->add_option("--prompts", sample_options.prompts_file, "a file of prompts, one a line: one PNG per sample in --out");
  sample->add_option("--per-prompt", sample_options.per_prompt, "samples per prompt")->capture_default_str();
  sample->add_option("--dump-inputs", sample_options.dump_inputs,
                     "write the first sampling step's model inputs (img, img_ids, txt, txt_ids, y, timesteps, "
                     "guidance) as safetensors");

  auto* data_cmd = app.add_subcommand("data", "make data sets");
  data_cmd->require_subcommand(1);
  auto* make_compositions = data_cmd->add_subcommand(
      "make-compositions", "Fashion compositions: captioned 56×56 canvases of 1-2 coloured garments in 4 slots, "
                           "evaluation prompts and a SentencePiece tokenizer (data/compositions.h)");
  data::CompositionsOptions compositions;
  compositions.fashion_dir = data::kFashionMnistDefaultDir;
  make_compositions->add_option("--out", compositions.out_dir, "output directory (must not exist)")->required();
  make_compositions->add_option("--num-train", compositions.num_train, "training canvases")->capture_default_str();
  make_compositions->add_option("--num-eval", compositions.num_eval, "evaluation prompts")->capture_default_str();
  make_compositions->add_option("--seed", compositions.seed, "seed")->capture_default_str();
  make_compositions->add_option("--fashion-mnist", compositions.fashion_dir, "Fashion-MNIST directory")
      ->capture_default_str();
  make_compositions->add_option("--vocab-size", compositions.vocab_size, "tokenizer pieces (upper bound)")
      ->capture_default_str();

  data::PackOptions pack_options;
  auto* pack = data_cmd->add_subcommand(
      "pack", "write a data set as WebDataset shards DIR/train-NNNNNN.tar plus DIR/index.json (data/shards/pack.h)");
  pack->add_option("--from", pack_options.from, "fashion-mnist | folder:PATH | compositions:PATH")->required();
  pack->add_option("--out", pack_options.out_dir, "output directory")->required();
  pack->add_option("--path", pack_options.path, "fashion-mnist: the IDX directory (default: Debian's)");
  pack->add_option("--split", pack_options.split, "fashion-mnist: train | test")->capture_default_str();
  pack->add_option("--max-count", pack_options.max_count, "samples per shard")->capture_default_str();
  pack->add_option("--max-size", pack_options.max_size, "bytes per shard")->capture_default_str();
  pack->add_option("--limit", pack_options.limit, "only the first N samples (0: all)")->capture_default_str();
  data::MovingFashionOptions moving;
  auto* make_moving = data_cmd->add_subcommand(
      "make-moving-fashion", "a synthetic video set as shards: a tinted garment moving left/right/up/down across a "
                             "32×32 frame, captioned (\"a red sneaker moving left\"), lossless H.264");
  make_moving->add_option("--out", moving.out_dir, "output directory")->required();
  make_moving->add_option("--num", moving.num, "clips")->capture_default_str();
  make_moving->add_option("--frames", moving.frames, "frames per clip")->capture_default_str();
  make_moving->add_option("--fps", moving.fps, "frame rate")->capture_default_str();
  make_moving->add_option("--seed", moving.seed, "seed")->capture_default_str();
  make_moving->add_option("--num-eval", moving.num_eval, "evaluation prompts (test-split garments)")->capture_default_str();
  make_moving->add_option("--vocab-size", moving.vocab_size, "tokenizer pieces (upper bound)")->capture_default_str();
  make_moving->add_option("--max-count", moving.max_count, "clips per shard")->capture_default_str();
  make_moving->add_option("--fashion-mnist", moving.fashion_dir, "Fashion-MNIST directory (default: Debian's)");
  std::vector<std::string> inspect_shards;
  bool inspect_summary = false;
  auto* data_inspect = data_cmd->add_subcommand(
      "inspect", "list a shard's samples with their members and sizes; exit 1 when any shard is damaged");
  data_inspect->add_option("shards", inspect_shards, "shard entries or brace patterns (paths, URLs, pipe:…)")
      ->required();
  data_inspect->add_flag("--summary", inspect_summary, "one line per shard");

  auto* checkpoint_cmd = app.add_subcommand("checkpoint", "look into a checkpoint directory");
  checkpoint_cmd->require_subcommand(1);
  std::string checkpoint_dir;
  auto* inspect = checkpoint_cmd->add_subcommand(
      "inspect", "step, mesh it was saved at, config hash, files with sizes and CRCs, tensors with global shapes");
  inspect->add_option("dir", checkpoint_dir, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();
  auto* verify = checkpoint_cmd->add_subcommand("verify", "check every file's size and CRC-32 against the manifest; "
                                                          "exit 1 naming the first bad file");
  verify->add_option("dir", checkpoint_dir, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();

  auto* exporter = app.add_subcommand("export", "write a checkpoint's weights as one safetensors file");
  trainer::ExportOptions export_options;
  exporter->add_option("--checkpoint", export_options.checkpoint_dir, "checkpoint directory")->required();
  exporter->add_option("--out", export_options.out_path, "output .safetensors file")->required();
  exporter->add_option("--text-encoder-out", export_options.text_encoder_out,
                       "with a built-in text encoder: its weights' file (--out gets the transformer alone)");
  exporter->add_flag("--ema", export_options.ema, "export the EMA weights");
  exporter->add_option("--dtype", export_options.dtype, "fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();

  auto* config = app.add_subcommand("config", "print the fully resolved config (defaults filled in)");
  config_args.add_to(config);

  ConfigArgs eval_args;
  std::string eval_checkpoint;
  int64_t eval_num = 0;
  bool eval_raw = false;
  auto* eval = app.add_subcommand("eval", "score a checkpoint's samples: FD, real-vs-real floor, class accuracy, IS; "
                                          "prompt following for text-to-image (data.source compositions)");
  eval_args.add_to(eval);
  eval->add_option("--checkpoint", eval_checkpoint, "checkpoint directory")->required();
  eval->add_option("--num", eval_num, "generated samples (default: eval.num)");
  eval->add_flag("--raw", eval_raw, "score the raw weights instead of the EMA weights (report: eval-raw.json)");

  ConfigArgs numerics_args;
  NumericsArgs numerics_options;
  auto* numerics = app.add_subcommand(
      "numerics", "fp8 numerics of one real batch, per recipe: each converted linear's SQNR of output, grad_input and "
                  "grad_weight against float64, input amax, saturated and underflowed fractions; the whole model's "
                  "loss and gradient-norm differences against fp32");
  numerics_args.add_to(numerics);
  numerics->add_option("--checkpoint", numerics_options.checkpoint,
                       "checkpoint directory (its raw weights; default: the fresh initialisation)");
  numerics->add_option("--recipe", numerics_options.recipes, "recipe to measure (repeatable; default: all)")
      ->check(CLI::IsMember(models::fp8::recipe_names()));
  numerics->add_option("--json", numerics_options.json, "also write the report as JSON to this file");

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
  bool bench_data_only = false;
  bench->add_flag("--data-only", bench_data_only,
                  "time only the data loader (data.workers threads, --steps batches after --warmup): samples/s, MB/s");
  bench->add_flag("--checkpoint", bench_options.checkpoint,
                  "also measure a save's cost: the run twice, saving synchronously then asynchronously "
                  "(checkpoint_sync_s, checkpoint_blocked_s, checkpoint_persist_s, step times overlapping a persist)");
  bench->add_option("--checkpoint-every", bench_options.checkpoint_every, "steps between saves (default: steps / 3)")
      ->check(CLI::NonNegativeNumber);
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
      if (!init_from.empty()) train_args.overrides.push_back("train.init_from=" + init_from);
      trainer::Trainer t(train_args.load());
      t.run();
      return 0;
    }
    if (*sample) return cmd_sample(sample_args, sample_options);
    if (*make_compositions) return cmd_make_compositions(compositions);
    if (*pack) {
      trainer::setup_logging("");
      const auto t0 = std::chrono::steady_clock::now();
      const data::PackResult r = data::pack_shards(pack_options);
      spdlog::info("packed {} samples into {} shards ({:.1f} MB) in {:.1f} s", r.samples, r.shards, r.bytes / 1e6,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::printf("%s\n", r.pattern.c_str());  // for data.shards
      return 0;
    }
    if (*make_moving) {
      trainer::setup_logging("");
      const auto t0 = std::chrono::steady_clock::now();
      const data::PackResult r = data::make_moving_fashion(moving);
      spdlog::info("wrote {} clips of {} frames into {} shards ({:.1f} MB) in {:.1f} s", r.samples, moving.frames,
                   r.shards, r.bytes / 1e6, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::printf("%s\n", r.pattern.c_str());
      return 0;
    }
    if (*data_inspect) return data::inspect_shards(inspect_shards, stdout, inspect_summary) == 0 ? 0 : 1;
    if (*exporter) {
      auto names = trainer::export_checkpoint(export_options);
      std::fprintf(stderr, "exported %zu tensors to %s\n", names.size(), export_options.out_path.c_str());
      return 0;
    }
    if (*config) return cmd_config(config_args);
    if (*inspect) {
      std::printf("%s", trainer::describe_checkpoint(checkpoint_dir).c_str());
      return 0;
    }
    if (*verify) return cmd_verify_checkpoint(checkpoint_dir);
    if (*bench && bench_data_only) {
      trainer::Config c = bench_args.load();
      trainer::setup_logging("");
      const auto report = trainer::run_data_bench(c, bench_options.steps, bench_options.warmup);
      std::printf("%s\n", report.to_table().c_str());
      if (!bench_json.empty()) trainer::write_file_atomic(bench_json, report.to_json() + "\n");
      return 0;
    }
    if (*bench) return cmd_bench(bench_args, bench_options, bench_json);
    if (*numerics) return cmd_numerics(numerics_args, numerics_options);
    if (*eval) {
      trainer::Config c = eval_args.load();
      trainer::setup_logging("");
      trainer::configure_threads(c.train);
      const std::string json =
          c.data.source == "compositions"
              ? trainer::evaluate_prompt_following_checkpoint(c, eval_checkpoint, eval_num, eval_raw).to_json()
          : trainer::judged_on_motion(c)
              ? trainer::evaluate_motion_following_checkpoint(c, eval_checkpoint, eval_num, eval_raw).to_json()
              : trainer::evaluate_checkpoint(c, eval_checkpoint, eval_num, eval_raw).to_json();
      std::printf("%s\n", json.c_str());
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
