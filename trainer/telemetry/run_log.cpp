#include "trainer/telemetry/run_log.h"

#include "trainer/checkpoint/file_util.h"

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <sstream>

namespace flowtrain::trainer {

void setup_logging(const std::string& log_file, int rank) {
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!log_file.empty()) sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(log_file, /*truncate=*/false));
  auto logger = std::make_shared<spdlog::logger>("flowtrain", sinks.begin(), sinks.end());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step) : path_(path) {
  if (std::filesystem::exists(path)) {
    // Keep only lines of steps <= resume_step; rewrite atomically.
    std::istringstream in(read_text_file(path));
    std::string line, kept;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) <= resume_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // A torn last line from a crash: drop it.
      }
    }
    write_file_atomic(path, kept);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error("cannot open " + path + " for appending");
}

void MetricsWriter::write(int64_t step, const std::map<std::string, double>& values) {
  nlohmann::json j;
  j["step"] = step;
  for (const auto& [k, v] : values) {
    if (std::isfinite(v)) j[k] = v;
    else j[k] = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  }
  out_ << j.dump() << "\n";
  out_.flush();
}

}  // namespace flowtrain::trainer
