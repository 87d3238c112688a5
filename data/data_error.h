// The one error type of the data layer: a bad or missing input file (IDX, safetensors, PNG, …).
// The message always names the file and what was expected, so `main` can print it as is.
#pragma once

#include <stdexcept>
#include <string>

namespace flowtrain::data {

struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace flowtrain::data
