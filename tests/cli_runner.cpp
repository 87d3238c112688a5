#include "cli_runner.h"

#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>

namespace flowtrain::test {

CommandResult run_flowtrain(const std::string& args, const std::string& env) {
  const std::string cmd = env + " " + FLOWTRAIN_BINARY + " " + args + " 2>&1";
  CommandResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

CommandResult train_tiny(const std::string& out_dir, const std::vector<std::string>& sets, const std::string& env) {
  std::string args = "train -c " + source_path("tests/configs/tiny_fashion.yaml") + " --set run.out_dir=" + out_dir +
                     " --set data.path=" + fashion_mnist_dir();
  for (const auto& s : sets) args += " --set " + s;
  return run_flowtrain(args, env);
}

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace flowtrain::test
