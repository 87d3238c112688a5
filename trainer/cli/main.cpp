// flowtrain — the command line. Each subcommand parses its flags, then calls one library entry
// point (trainer/cli/command.h); every user-facing failure arrives here as a typed exception and
// leaves as one clear error line and a non-zero exit code (2: bad config or usage, 1: anything else).
#include "data/data_error.h"
#include "parallel/comm.h"
#include "parallel/env.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/cli/command.h"
#include "trainer/telemetry/memory_stats.h"
#include "trainer/trainer.h"

#include <csignal>
#include <cstdio>

using namespace flowtrain;

namespace {

// The subcommands, in the order `flowtrain --help` lists them.
using AddCommands = std::vector<cli::Command> (*)(CLI::App&);
constexpr AddCommands kCommands[] = {
    cli::add_run_commands,   cli::add_sampling_commands,   cli::add_data_commands,
    cli::add_checkpoint_commands, cli::add_measure_commands, cli::add_launch_command,
};

// Runs the chosen command; each typed error becomes one line on stderr and its exit code.
int run_reporting_errors(const std::function<int()>& run) {
  try {
    return run();
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
  std::vector<cli::Command> commands;
  for (const AddCommands add : kCommands)
    for (cli::Command& command : add(app)) commands.push_back(std::move(command));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const cli::Command& command : commands)
    if (command.parser->parsed()) return run_reporting_errors(command.run);
  std::fprintf(stderr, "flowtrain: no subcommand ran\n");  // require_subcommand makes this unreachable
  return 2;
}
