// The subcommands of the flowtrain binary. Each add_* function puts its subcommands on the
// parser with their flags and returns what each runs; main.cpp is the table of them and the one
// place a typed error becomes an exit code.
#pragma once

#include "trainer/config/config.h"

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace flowtrain::cli {

struct Command {
  CLI::App* parser = nullptr;  // parsed when the user named this subcommand
  std::function<int()> run;    // its exit code; typed errors propagate to main
};

// -c/--config FILE and repeatable --set section.key=value, shared by every config-reading command.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
  void add_to(CLI::App* cmd) {
    cmd->add_option("-c,--config", path, "YAML run config (see configs/)")->required()->check(CLI::ExistingFile);
    cmd->add_option("--set", overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
  }
  trainer::Config load() const { return trainer::load_config(path, overrides); }
};

std::vector<Command> add_run_commands(CLI::App& app);         // train, config, export
std::vector<Command> add_sampling_commands(CLI::App& app);    // sample, eval, train-classifier
std::vector<Command> add_measure_commands(CLI::App& app);     // bench, numerics
std::vector<Command> add_data_commands(CLI::App& app);        // data make-compositions|pack|make-moving-fashion|inspect
std::vector<Command> add_checkpoint_commands(CLI::App& app);  // checkpoint inspect|verify
std::vector<Command> add_launch_command(CLI::App& app);       // launch

}  // namespace flowtrain::cli
