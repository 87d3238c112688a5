#pragma once
// The error a run stops with when training itself cannot go on: a health verdict, a failed
// save under checkpoint.on_error: stop, data that ranks or a resumed checkpoint disagree on.
// `flowtrain train` maps it to its own exit code (cli/main.cpp).
#include <stdexcept>

namespace flowtrain::trainer {

struct TrainingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace flowtrain::trainer
