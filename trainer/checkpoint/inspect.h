// `flowtrain checkpoint inspect DIR`: what a checkpoint holds, from its manifest and the file
// headers (no tensor data is read): step and progress, the mesh it was saved at, the config's
// hash, every file with its size, CRC-32 and writer rank, and every tensor with its global shape.
// (`flowtrain checkpoint verify DIR` is verify_checkpoint(), checkpoint.h.)
#pragma once

#include <string>

namespace flowtrain::trainer {

// The report as text. Throws CheckpointError naming the file when the manifest or a header is
// unreadable.
std::string describe_checkpoint(const std::string& dir);

}  // namespace flowtrain::trainer
