// flowtrain sample | eval | train-classifier: a checkpoint's samples, their scores, the judge.
#include "data/data_error.h"
#include "data/fashion_mnist.h"
#include "data/png.h"
#include "models/autocast_region.h"
#include "trainer/builders.h"
#include "trainer/cli/command.h"
#include "trainer/frozen/frozen_sampling.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/classifier_cache.h"
#include "trainer/eval/evaluator.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/family.h"
#include "trainer/run_conditioning.h"
#include "trainer/telemetry/run_log.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace flowtrain::cli {

namespace {

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
  if (from_prompts && !trainer::reads_caption_tokens(c.model) && !trainer::has_frozen_text_encoders(c.model))
    throw trainer::ConfigError(fmt::format("--prompt / --prompts need a model that reads captions through its own text "
                                           "encoder (model.text_encoder_layers > 0), or frozen text encoders that embed "
                                           "them (model.text_encoders.*); this config's model.arch {} has neither",
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
        trainer::has_frozen_text_encoders(c.model) && !trainer::reads_caption_tokens(c.model)
            ? trainer::frozen_prompt_conditioning(c, prompts)
            : trainer::prompt_conditioning(c, *trainer::data_tokenizer(c), prompts));
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
      chunks.push_back(trainer::samples_to_pixels(
          c, trainer::sample_rows(velocity, model, rows, num, c.sample.seed, so, device, first,
                                  std::min(kChunk, num - first))));
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
                 prompts.size(), a.per_prompt, loaded.ema ? "EMA" : "raw", loaded.step, trainer::name_of(c.sample.sampler),
                 c.sample.steps, c.sample.cfg_scale, c.sample.seed);
    return 0;
  }
  const std::string out = a.out.empty() ? "grid.png" : a.out;
  trainer::write_sample_grid(out, samples, columns, trainer::sample_video_fps(c));
  spdlog::info("wrote {} ({} samples from {} weights at step {}, {} {} steps, cfg {})", out, num,
               loaded.ema ? "EMA" : "raw", loaded.step, trainer::name_of(c.sample.sampler), c.sample.steps, c.sample.cfg_scale);
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

}  // namespace

std::vector<Command> add_sampling_commands(CLI::App& app) {
  std::vector<Command> commands;

  auto sample_args = std::make_shared<ConfigArgs>();
  auto sample_options = std::make_shared<SampleArgs>();
  auto* sample = app.add_subcommand("sample", "write samples of a checkpoint: a grid (classes, evaluation prompts or "
                                              "--prompt), or one PNG per line of --prompts");
  sample_args->add_to(sample);
  sample->add_option("--checkpoint", sample_options->checkpoint, "checkpoint directory (…/checkpoints/step-NNNNNNN)")
      ->required();
  sample->add_option("--out", sample_options->out, "output PNG (grid.png), or the directory of --prompts (samples)");
  sample->add_option("--cfg-scale", sample_options->cfg_scale,
                     "classifier-free guidance scale (default: sample.cfg_scale)");
  sample->add_option("--steps", sample_options->steps, "sampler steps (default: sample.steps)");
  sample->add_option("--seed", sample_options->seed, "noise seed (default: sample.seed)");
  sample->add_flag("--raw", sample_options->raw, "use the raw weights instead of the EMA weights");
  sample->add_option("--prompt", sample_options->prompts, "a text prompt (repeatable): one grid row per prompt");
  sample->add_option("--prompts", sample_options->prompts_file,
                     "a file of prompts, one a line: one PNG per sample in --out");
  sample->add_option("--per-prompt", sample_options->per_prompt, "samples per prompt")->capture_default_str();
  sample->add_option("--dump-inputs", sample_options->dump_inputs,
                     "write the first sampling step's model inputs (img, img_ids, txt, txt_ids, y, timesteps, "
                     "guidance) as safetensors");
  commands.push_back({sample, [sample_args, sample_options] { return cmd_sample(*sample_args, *sample_options); }});

  struct EvalArgs {
    ConfigArgs config;
    std::string checkpoint;
    int64_t num = 0;
    bool raw = false;
  };
  auto eval_args = std::make_shared<EvalArgs>();
  auto* eval = app.add_subcommand("eval", "score a checkpoint's samples: FD, real-vs-real floor, class accuracy, IS; "
                                          "prompt following for text-to-image (data.source compositions)");
  eval_args->config.add_to(eval);
  eval->add_option("--checkpoint", eval_args->checkpoint, "checkpoint directory")->required();
  eval->add_option("--num", eval_args->num, "generated samples (default: eval.num)");
  eval->add_flag("--raw", eval_args->raw, "score the raw weights instead of the EMA weights (report: eval-raw.json)");
  commands.push_back({eval, [eval_args] {
                        trainer::Config c = eval_args->config.load();
                        trainer::setup_logging("");
                        trainer::configure_threads(c.train);
                        const std::string json = trainer::make_evaluator(c)->evaluate_checkpoint(
                            c, eval_args->checkpoint, eval_args->num, eval_args->raw);
                        std::printf("%s\n", json.c_str());
                        return 0;
                      }});

  struct ClassifierArgs {
    ConfigArgs config;
    bool force = false;
  };
  auto classifier_args = std::make_shared<ClassifierArgs>();
  auto* train_classifier = app.add_subcommand(
      "train-classifier", "train (or load from the cache) the Fashion-MNIST classifier that eval uses as its judge");
  classifier_args->config.add_to(train_classifier);
  train_classifier->add_flag("--force", classifier_args->force, "retrain even if a valid cached classifier exists");
  commands.push_back({train_classifier, [classifier_args] {
                        return cmd_train_classifier(classifier_args->config, classifier_args->force);
                      }});
  return commands;
}

}  // namespace flowtrain::cli
