// flowtrain train | config | export | checkpoint … | launch: a run from its config, the config
// resolved, a run's weights out, a checkpoint looked into, ranks of a run started on this node.
#include "parallel/launch.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/export.h"
#include "trainer/checkpoint/inspect.h"
#include "trainer/cli/command.h"
#include "trainer/config/resolve.h"
#include "trainer/family.h"
#include "trainer/frozen/frozen_models.h"
#include "trainer/memory_estimate.h"
#include "trainer/trainer.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

namespace flowtrain::cli {

namespace {

// Where `flowtrain config` resolves the config: this process's environment, or a planned one.
struct PlannedEnvironment {
  int64_t world = 0, ranks_per_node = 0, gpus = -1;  // 0 / −1: as this process sees it
};

int cmd_config(const ConfigArgs& args, const PlannedEnvironment& planned) {
  trainer::Config c = args.load();
  trainer::RunEnvironment env = trainer::this_environment(parallel::resolve_dist_env_from_process());
  if (planned.world > 0) env.world = planned.world;
  if (planned.ranks_per_node > 0) env.ranks_per_node = planned.ranks_per_node;
  if (planned.world > 0 && planned.ranks_per_node <= 0) env.ranks_per_node = std::min(env.world, env.ranks_per_node);
  if (planned.gpus >= 0) env.cuda_devices = planned.gpus;
  const trainer::ResolvedRun resolved = trainer::resolve(c, env);  // throws ConfigError on a broken rule
  const trainer::ModelCost cost = trainer::model_family(c.model.arch).cost(c.model);
  std::printf("# resolved config of %s\n", c.source_path.c_str());
  const int64_t transformer = cost.parameters - cost.text_encoder_parameters;
  std::printf("# model: %.3fM parameters (%.2fB)", transformer / 1e6, transformer / 1e9);
  if (cost.text_encoder_parameters > 0)  // the transformer's count first: the figure its references quote
    std::printf(" + built-in text encoder %.3fM (%.2fB)", cost.text_encoder_parameters / 1e6,
                cost.text_encoder_parameters / 1e9);
  std::printf(", %.4f GFLOP per training sample (3x forward; %ld tokens)\n", cost.train_flops_per_sample / 1e9,
              static_cast<long>(cost.tokens_per_sample));
  std::printf("# for %s:\n", env.describe().c_str());
  for (const auto& [key, value] : resolved.lines(c)) std::printf("#   %-9s %s\n", key.c_str(), value.c_str());
  for (const auto& [key, value] : trainer::estimate_memory(c, resolved).lines())
    std::printf("#   %-9s %s\n", key.c_str(), value.c_str());
  std::printf("%s\n", trainer::to_yaml(c).c_str());
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

std::vector<Command> add_run_commands(CLI::App& app) {
  std::vector<Command> commands;

  struct TrainArgs {
    ConfigArgs config;
    std::string init_from;
  };
  auto train_args = std::make_shared<TrainArgs>();
  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train_args->config.add_to(train);
  train->add_option("--init-from", train_args->init_from,
                    "initial weights: a safetensors file with the reference key names (= --set train.init_from=FILE)");
  commands.push_back({train, [train_args] {
                        ConfigArgs config = train_args->config;
                        if (!train_args->init_from.empty())
                          config.overrides.push_back("train.init_from=" + train_args->init_from);
                        trainer::Trainer t(config.load());
                        t.run();
                        return 0;
                      }});

  auto config_args = std::make_shared<ConfigArgs>();
  auto planned = std::make_shared<PlannedEnvironment>();
  auto* config = app.add_subcommand("config", "print the fully resolved config (defaults filled in) and what it "
                                              "resolves to where it would run; exits 2 on a rule it breaks");
  config_args->add_to(config);
  config->add_option("--world", planned->world, "resolve for a job of this many ranks (default: this process's)")
      ->check(CLI::PositiveNumber);
  config->add_option("--ranks-per-node", planned->ranks_per_node, "ranks sharing a machine (default: this process's)")
      ->check(CLI::PositiveNumber);
  config->add_option("--gpus", planned->gpus, "GPUs a machine has (default: as this machine)")
      ->check(CLI::NonNegativeNumber);
  commands.push_back({config, [config_args, planned] { return cmd_config(*config_args, *planned); }});

  auto export_options = std::make_shared<trainer::ExportOptions>();
  auto component = std::make_shared<std::pair<std::string, std::string>>();  // name, source path
  auto* exporter = app.add_subcommand(
      "export", "write a checkpoint's weights as one safetensors file, or a frozen model (--component) back as its "
                "release holds it");
  auto* from_checkpoint =
      exporter->add_option("--checkpoint", export_options->checkpoint_dir, "checkpoint directory");
  auto* component_option = exporter->add_option("--component", component->first, "autoencoder | t5 | clip")
                               ->check(CLI::IsMember({"autoencoder", "t5", "clip"}));
  from_checkpoint->excludes(component_option);
  exporter->add_option("--from", component->second,
                       "with --component: ae.safetensors, or the T5 / CLIP release folder (config.json + weights)")
      ->needs(component_option);
  exporter->add_option("--out", export_options->out_path, "output .safetensors file")->required();
  exporter->add_option("--text-encoder-out", export_options->text_encoder_out,
                       "with a built-in text encoder: its weights' file (--out gets the transformer alone)");
  exporter->add_flag("--ema", export_options->ema, "export the EMA weights");
  exporter->add_option("--dtype", export_options->dtype, "fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  commands.push_back({exporter, [export_options, component] {
                        std::vector<std::string> names;
                        if (!component->first.empty()) {
                          if (component->second.empty())
                            throw CLI::ValidationError("--component", "needs --from (the file or folder to load)");
                          names = trainer::export_component(trainer::frozen_component(component->first),
                                                            component->second, export_options->out_path,
                                                            export_options->dtype == "bf16" ? at::kBFloat16 : at::kFloat);
                        } else if (!export_options->checkpoint_dir.empty()) {
                          names = trainer::export_checkpoint(*export_options);
                        } else {
                          throw CLI::ValidationError("export", "give --checkpoint DIR or --component NAME --from PATH");
                        }
                        std::fprintf(stderr, "exported %zu tensors to %s\n", names.size(),
                                     export_options->out_path.c_str());
                        return 0;
                      }});
  return commands;
}

std::vector<Command> add_checkpoint_commands(CLI::App& app) {
  auto* checkpoint_cmd = app.add_subcommand("checkpoint", "look into a checkpoint directory");
  checkpoint_cmd->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto* inspect = checkpoint_cmd->add_subcommand(
      "inspect", "step, mesh it was saved at, config hash, files with sizes and CRCs, tensors with global shapes");
  inspect->add_option("dir", *dir, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();
  auto* verify = checkpoint_cmd->add_subcommand("verify", "check every file's size and CRC-32 against the manifest; "
                                                          "exit 1 naming the first bad file");
  verify->add_option("dir", *dir, "checkpoint directory (…/checkpoints/step-NNNNNNN)")->required();
  return {{inspect,
           [dir] {
             std::printf("%s", trainer::describe_checkpoint(*dir).c_str());
             return 0;
           }},
          {verify, [dir] { return cmd_verify_checkpoint(*dir); }}};
}

std::vector<Command> add_launch_command(CLI::App& app) {
  struct LaunchArgs {
    parallel::LaunchOptions options;
    std::vector<std::string> command;
    CLI::Option* node_rank = nullptr;
  };
  auto l = std::make_shared<LaunchArgs>();
  auto* launch = app.add_subcommand("launch",
                                    "run N ranks of a flowtrain subcommand on this node (like torchrun): "
                                    "launch --nproc-per-node N -- train -c cfg.yaml");
  // Ranges are checked by launch_local, whose messages name the flag and the allowed values.
  launch->add_option("--nproc-per-node", l->options.nproc_per_node, "ranks on this node (one per GPU)")
      ->capture_default_str();
  launch->add_option("--nnodes", l->options.nnodes, "nodes in the job")->capture_default_str();
  l->node_rank = launch->add_option(
      "--node-rank", l->options.node_rank,
      "this node's index (default with --nnodes > 1: JOB_COMPLETION_INDEX, else SLURM_NODEID)");
  launch->add_option("--master-addr", l->options.master_addr, "host of rank 0")->capture_default_str();
  launch->add_option("--master-port", l->options.master_port,
                     "port of rank 0 (default: a free port; required with --nnodes > 1)");
  launch->add_option("--grace-seconds", l->options.grace_seconds,
                     "after a rank fails: SIGTERM the others, SIGKILL them after this long")
      ->capture_default_str();
  // Everything after `--` lands here untouched (flags such as --set included).
  launch->add_option("command", l->command, "the flowtrain subcommand and its arguments, after --")->required();
  return {{launch, [l] { return cmd_launch(l->options, l->command, l->node_rank->count() > 0); }}};
}

}  // namespace flowtrain::cli
