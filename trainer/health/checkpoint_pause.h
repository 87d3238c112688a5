// debug.inject.checkpoint_pause, parsed: the crash-consistency drill's pause inside a checkpoint
// save (trainer/health/fault_injection.h carries it out).
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::trainer {

struct CheckpointPause {
  int64_t step = 0;      // the save of this step's checkpoint
  double seconds = 0;    // sleeps this long after its first file is written
  bool torn = false;     // and first cuts that file to half its bytes (what a kill inside it leaves)
};

// "STEP:SECONDS" or "STEP:SECONDS:torn"; throws ConfigError naming debug.inject.checkpoint_pause.
CheckpointPause parse_checkpoint_pause(const std::string& text);

}  // namespace flowtrain::trainer
