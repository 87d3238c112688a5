// Internal to parallel/: builds a c10d backend for one process group. Only the comm_*.cpp files
// include this (it pulls in the c10d headers).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/Device.h>

#include <chrono>

namespace flowtrain::parallel::detail {

// ProcessGroupNCCL for `size` ranks over `store` on `device` (set as the current device first).
// Defined in comm_nccl.cpp when the build has NCCL; otherwise throws CommError.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, c10::Device device);
void shutdown_nccl_backend(const c10::intrusive_ptr<c10d::Backend>& backend);

}  // namespace flowtrain::parallel::detail
