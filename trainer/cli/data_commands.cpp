// flowtrain data …: the synthetic data sets, shards from a data set, a shard's contents.
#include "data/compositions.h"
#include "data/fashion_mnist.h"
#include "data/shards/pack.h"
#include "data/shards/shard_inspect.h"
#include "parallel/env.h"
#include "trainer/cli/command.h"
#include "trainer/frozen/encode_shards.h"
#include "trainer/telemetry/run_log.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <memory>

namespace flowtrain::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int cmd_make_compositions(data::CompositionsOptions o) {
  trainer::setup_logging("");
  const auto t0 = std::chrono::steady_clock::now();
  data::make_compositions(o);
  spdlog::info("wrote {} ({} training canvases, {} evaluation prompts, seed {}) in {:.1f} s", o.out_dir, o.num_train,
               o.num_eval, o.seed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

std::vector<Command> add_data_commands(CLI::App& app) {
  std::vector<Command> commands;
  auto* data_cmd = app.add_subcommand("data", "make data sets");
  data_cmd->require_subcommand(1);

  auto compositions = std::make_shared<data::CompositionsOptions>();
  compositions->fashion_dir = data::kFashionMnistDefaultDir;
  auto* make_compositions = data_cmd->add_subcommand(
      "make-compositions", "Fashion compositions: captioned 56×56 canvases of 1-2 coloured garments in 4 slots, "
                           "evaluation prompts and a SentencePiece tokenizer (data/compositions.h)");
  make_compositions->add_option("--out", compositions->out_dir, "output directory (must not exist)")->required();
  make_compositions->add_option("--num-train", compositions->num_train, "training canvases")->capture_default_str();
  make_compositions->add_option("--num-eval", compositions->num_eval, "evaluation prompts")->capture_default_str();
  make_compositions->add_option("--seed", compositions->seed, "seed")->capture_default_str();
  make_compositions->add_option("--fashion-mnist", compositions->fashion_dir, "Fashion-MNIST directory")
      ->capture_default_str();
  make_compositions->add_option("--vocab-size", compositions->vocab_size, "tokenizer pieces (upper bound)")
      ->capture_default_str();
  commands.push_back({make_compositions, [compositions] { return cmd_make_compositions(*compositions); }});

  auto pack_options = std::make_shared<data::PackOptions>();
  auto* pack = data_cmd->add_subcommand(
      "pack", "write a data set as WebDataset shards DIR/train-NNNNNN.tar plus DIR/index.json (data/shards/pack.h)");
  pack->add_option("--from", pack_options->from, "fashion-mnist | folder:PATH | compositions:PATH")->required();
  pack->add_option("--out", pack_options->out_dir, "output directory")->required();
  pack->add_option("--path", pack_options->path, "fashion-mnist: the IDX directory (default: Debian's)");
  pack->add_option("--split", pack_options->split, "fashion-mnist: train | test")->capture_default_str();
  pack->add_option("--max-count", pack_options->max_count, "samples per shard")->capture_default_str();
  pack->add_option("--max-size", pack_options->max_size, "bytes per shard")->capture_default_str();
  pack->add_option("--limit", pack_options->limit, "only the first N samples (0: all)")->capture_default_str();
  commands.push_back({pack, [pack_options] {
                        trainer::setup_logging("");
                        const auto t0 = std::chrono::steady_clock::now();
                        const data::PackResult r = data::pack_shards(*pack_options);
                        spdlog::info("packed {} samples into {} shards ({:.1f} MB) in {:.1f} s", r.samples, r.shards,
                                     r.bytes / 1e6, seconds_since(t0));
                        std::printf("%s\n", r.pattern.c_str());  // for data.shards
                        return 0;
                      }});

  auto encode_config = std::make_shared<ConfigArgs>();
  auto encode_options = std::make_shared<trainer::EncodeOptions>();
  auto encode_dtype = std::make_shared<std::string>("fp32");
  auto* encode = data_cmd->add_subcommand(
      "encode", "run the config's frozen models (model.autoencoder, model.text_encoders.*) over image+caption shards: "
                "writes shards of the same names with .latent/.txt_emb/.vec.safetensors members; on N ranks each takes "
                "every N-th shard; a rerun skips finished shards (trainer/frozen/encode_shards.h)");
  encode_config->add_to(encode);
  encode->add_option("--in", encode_options->inputs, "input shards: entries or brace patterns")->required();
  encode->add_option("--out", encode_options->out_dir, "output directory")->required();
  encode->add_option("--dtype", *encode_dtype, "of the written latents and embeddings: fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  encode->add_option("--batch", encode_options->batch, "samples per encoder call")->capture_default_str();
  commands.push_back({encode, [encode_config, encode_options, encode_dtype] {
                        const trainer::Config config = encode_config->load();
                        const parallel::DistEnv env = parallel::resolve_dist_env_from_process();
                        trainer::setup_logging("");
                        encode_options->dtype = *encode_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
                        const auto t0 = std::chrono::steady_clock::now();
                        const trainer::EncodeReport r =
                            trainer::encode_shards(config, *encode_options, env.rank, env.world);
                        spdlog::info("data encode: rank {}/{}: wrote {} shards ({} samples, {} damaged skipped), {} "
                                     "already done, in {:.1f} s",
                                     env.rank, env.world, r.shards, r.samples, r.damaged, r.skipped_shards,
                                     seconds_since(t0));
                        return 0;
                      }});

  auto moving = std::make_shared<data::MovingFashionOptions>();
  auto* make_moving = data_cmd->add_subcommand(
      "make-moving-fashion", "a synthetic video set as shards: a tinted garment moving left/right/up/down across a "
                             "32×32 frame, captioned (\"a red sneaker moving left\"), lossless H.264");
  make_moving->add_option("--out", moving->out_dir, "output directory")->required();
  make_moving->add_option("--num", moving->num, "clips")->capture_default_str();
  make_moving->add_option("--frames", moving->frames, "frames per clip")->capture_default_str();
  make_moving->add_option("--fps", moving->fps, "frame rate")->capture_default_str();
  make_moving->add_option("--seed", moving->seed, "seed")->capture_default_str();
  make_moving->add_option("--num-eval", moving->num_eval, "evaluation prompts (test-split garments)")
      ->capture_default_str();
  make_moving->add_option("--vocab-size", moving->vocab_size, "tokenizer pieces (upper bound)")->capture_default_str();
  make_moving->add_option("--max-count", moving->max_count, "clips per shard")->capture_default_str();
  make_moving->add_option("--fashion-mnist", moving->fashion_dir, "Fashion-MNIST directory (default: Debian's)");
  commands.push_back({make_moving, [moving] {
                        trainer::setup_logging("");
                        const auto t0 = std::chrono::steady_clock::now();
                        const data::PackResult r = data::make_moving_fashion(*moving);
                        spdlog::info("wrote {} clips of {} frames into {} shards ({:.1f} MB) in {:.1f} s", r.samples,
                                     moving->frames, r.shards, r.bytes / 1e6, seconds_since(t0));
                        std::printf("%s\n", r.pattern.c_str());
                        return 0;
                      }});

  struct InspectArgs {
    std::vector<std::string> shards;
    bool summary = false;
  };
  auto inspect_args = std::make_shared<InspectArgs>();
  auto* data_inspect = data_cmd->add_subcommand(
      "inspect", "list a shard's samples with their members and sizes; exit 1 when any shard is damaged");
  data_inspect->add_option("shards", inspect_args->shards, "shard entries or brace patterns (paths, URLs, pipe:…)")
      ->required();
  data_inspect->add_flag("--summary", inspect_args->summary, "one line per shard");
  commands.push_back({data_inspect, [inspect_args] {
                        return data::inspect_shards(inspect_args->shards, stdout, inspect_args->summary) == 0 ? 0 : 1;
                      }});
  return commands;
}

}  // namespace flowtrain::cli
