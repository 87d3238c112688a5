// Which frozen files a run trains with, recorded in its checkpoints: the frozen models are never
// in a checkpoint (T5-XXL alone is 9.5 GB), so a checkpoint names them with a digest of their
// content (size + CRC-32 of each file a model is made of: weights, their index and config.json,
// the tokenizers' files), and a resume whose config names files of other content is refused
// with both named. The paths may differ (a copy elsewhere resumes); the content may not.
#pragma once

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"

#include <map>
#include <string>

namespace flowtrain::trainer {

// Whether the model section names any frozen file.
bool has_frozen_files(const ModelConfig& model);
// By config key: model.autoencoder, model.text_encoders.{t5,t5_tokenizer,clip,clip_tokenizer},
// those that are set. Reads every byte of them (once per run start).
std::map<std::string, FrozenFileRecord> frozen_file_records(const ModelConfig& model);

// Throws CheckpointError naming the key, both paths and both contents when `recorded` (from the
// checkpoint at `checkpoint_dir`) and `current` differ in a key or a content.
void check_same_frozen_files(const std::map<std::string, FrozenFileRecord>& recorded,
                             const std::map<std::string, FrozenFileRecord>& current, const std::string& checkpoint_dir);

}  // namespace flowtrain::trainer
