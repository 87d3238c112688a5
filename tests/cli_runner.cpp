#include "cli_runner.h"

#include "test_util.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <map>
#include <cstdio>
#include <fstream>
#include <stdexcept>
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

std::string tiny_config(const std::string& arch) {
  const std::string dit = source_path("tests/configs/tiny_fashion.yaml");
  if (arch == "dit") return dit;
  const std::string path = scratch_dir("tiny_config_" + arch) + "/tiny.yaml";
  const std::string text = read_file(dit);
  std::istringstream in(text);
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (line.find("num_classes:") == std::string::npos) kept += line + "\n";
  if (kept.size() + 1 >= text.size()) throw std::runtime_error("tiny_config: no num_classes line in " + dit);
  std::ofstream(path) << kept;
  return path;
}

CommandResult train_tiny(const std::string& out_dir, const std::vector<std::string>& sets, const std::string& env,
                         const std::string& arch) {
  std::string args = "train -c " + tiny_config(arch) + " --set run.out_dir=" + out_dir +
                     " --set data.path=" + fashion_mnist_dir();
  for (const auto& s : sets) args += " --set " + s;
  return run_flowtrain(args, env);
}

std::vector<nlohmann::json> read_metric_rows(const std::string& run_dir, const std::string& key) {
  std::istringstream in(read_file(run_dir + "/metrics.jsonl"));
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains(key)) rows.push_back(std::move(row));
  }
  return rows;
}

std::string ckpt(const std::string& run_dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%07d", step);
  return run_dir + "/checkpoints/" + name;
}

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) { return read_metric_rows(run_dir, "loss"); }

double mean_loss(const std::vector<nlohmann::json>& rows, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += rows[i]["loss"].get<double>();
  return s / double(end - begin);
}

std::string chrome_trace_problems(const nlohmann::json& trace) {
  if (!trace.contains("traceEvents") || !trace["traceEvents"].is_array()) return "no traceEvents array";
  struct Slice { double begin, end; std::string name; };
  std::map<std::string, std::vector<Slice>> threads;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") || !e["dur"].is_number())
      return "complete event without numeric ts/dur: " + e.dump();
    if (!e.contains("pid") || !e.contains("tid")) return "event without pid/tid: " + e.dump();
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    if (dur < 0) return "negative duration: " + e.dump();
    threads[e["pid"].dump() + "/" + e["tid"].dump()].push_back({ts, ts + dur, e.value("name", "")});
  }
  for (auto& [thread, slices] : threads) {
    // Longer slices first at equal start, so a parent precedes its children.
    std::sort(slices.begin(), slices.end(), [](const Slice& a, const Slice& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<Slice> open;
    for (const Slice& s : slices) {
      while (!open.empty() && open.back().end <= s.begin) open.pop_back();
      // 1 µs of slack: Kineto rounds timestamps to microseconds.
      if (!open.empty() && s.end > open.back().end + 1.0)
        return "slices overlap without nesting on thread " + thread + ": '" + open.back().name + "' and '" + s.name + "'";
      open.push_back(s);
    }
  }
  return "";
}

}  // namespace flowtrain::test
