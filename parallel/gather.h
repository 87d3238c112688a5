// Every member's copy of a small value, by rank: the all-gathers the trainer needs for host
// names, per-rank numbers and sample slices, written once over Comm::all_gather.
#pragma once

#include "parallel/comm.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace flowtrain::parallel {

// [group.size(), mine.sizes()...] on the CPU: row r is member r's `mine`. `mine` must have the
// same shape and dtype on every member and live on the group's device.
at::Tensor gather_rows(Comm& group, const at::Tensor& mine);

// Each member's vector (the same length on every member), by rank. `device`: the group's.
std::vector<std::vector<double>> gather_vector(Comm& group, const std::vector<double>& mine, const c10::Device& device);
std::vector<int64_t> gather_value(Comm& group, int64_t mine, const c10::Device& device);
// Each member's string, cut to max_bytes − 1 bytes (host names and the like).
std::vector<std::string> gather_string(Comm& group, const std::string& mine, int64_t max_bytes,
                                       const c10::Device& device);

}  // namespace flowtrain::parallel
