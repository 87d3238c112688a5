// Peak memory of this process, the way a training engineer states it: the peak including every
// transient (gathered FSDP units, gradient buffers, activations), not only persistent state.
//
//   CPU  peak RSS (getrusage ru_maxrss: every page the process ever had resident, LibTorch's
//        code and allocator caching included) and the peak of live CPU tensor bytes, counted by
//        a thin allocator installed in front of LibTorch's default one (install_memory_tracking).
//   CUDA the caching allocator's peak allocated bytes (torch.cuda.max_memory_allocated), plus
//        the process's peak RSS for the host side.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace flowtrain::trainer {

struct MemoryPeaks {
  int64_t rss_bytes = 0;        // host: peak resident set of the process
  int64_t allocated_bytes = 0;  // tensors: peak live bytes of the device's allocator
  std::string allocated_kind;   // "cpu tensor allocator" | "cuda max_memory_allocated"
};

// Routes CPU tensor allocations through a counter of live and peak bytes (same memory, same
// alignment as LibTorch's default allocator; frees of tensors made before it are not counted).
// Idempotent; every command that computes calls it at start (configure_threads).
void install_memory_tracking();

MemoryPeaks memory_peaks(const c10::Device& device);

// Memory now, for trends (the health monitor samples it every log interval).
struct MemoryNow {
  int64_t rss_bytes = 0;        // resident set now (/proc/self/statm)
  int64_t allocated_bytes = 0;  // live tensor bytes: CUDA allocated, or the CPU counter
  int64_t reserved_bytes = 0;   // CUDA: the caching allocator's reserved bytes; CPU: 0
};
MemoryNow memory_now(const c10::Device& device);

}  // namespace flowtrain::trainer
