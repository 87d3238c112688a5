// Batch ordinals: the position of a batch in a run's data order, 1 for the first batch drawn,
// counted across resumes (a checkpoint stores how many were drawn). data.skip_batches lists
// ordinals to discard ("N" or "A-B"); a health rollback adds the ordinal of the batch it rolls
// back past, so the restored run continues as one that never saw it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// "12", "40-45" → {12, 40, …, 45}. Throws ConfigError naming `key` on a malformed item, an
// ordinal < 1 or a range of more than a million batches.
std::set<int64_t> parse_batch_ordinals(const std::vector<std::string>& items, const std::string& key);

}  // namespace flowtrain::trainer
