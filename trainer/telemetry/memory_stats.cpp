#include "trainer/telemetry/memory_stats.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define FLOWTRAIN_HAS_CUDA_ALLOCATOR 1
#endif

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace flowtrain::trainer {

namespace {

std::atomic<int64_t> live_bytes{0}, peak_bytes{0};

void count(int64_t delta) {
  const int64_t now = live_bytes.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// glibc's usable size of the block: what the allocation really holds (≥ the request).
int64_t block_bytes(void* p) { return p ? static_cast<int64_t>(malloc_usable_size(p)) : 0; }

void report_to_profiler(void* p, int64_t delta) {
  // Keeps profile.memory traces working: LibTorch's default CPU allocator reports the same way.
  if (c10::memoryProfilingEnabled())
    c10::reportMemoryUsageToProfiler(p, delta, static_cast<size_t>(live_bytes.load()), 0, c10::Device(c10::kCPU));
}

void counted_free(void* p) {
  const int64_t bytes = block_bytes(p);
  count(-bytes);
  report_to_profiler(p, -bytes);
  c10::free_cpu(p);
}

// The default CPU allocator's memory (c10::alloc_cpu: aligned, huge-page advice for big blocks)
// with a counter around it. Its deleter needs only the pointer, so raw_allocate works too.
struct CountingCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    const int64_t bytes = block_bytes(p);
    count(bytes);
    report_to_profiler(p, bytes);
    return {p, p, &counted_free, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

}  // namespace

void install_memory_tracking() {
  static CountingCpuAllocator allocator;
  static const bool installed = [] {
    // Priority above the default registration (0), so later registrations at 0 do not replace it.
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

MemoryPeaks memory_peaks(const c10::Device& device) {
  MemoryPeaks m;
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  m.rss_bytes = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
#ifdef FLOWTRAIN_HAS_CUDA_ALLOCATOR
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    m.allocated_bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
    m.allocated_kind = "cuda max_memory_allocated";
    return m;
  }
#endif
  m.allocated_bytes = peak_bytes.load();
  m.allocated_kind = "cpu tensor allocator";
  return m;
}

MemoryNow memory_now(const c10::Device& device) {
  MemoryNow m;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2) m.rss_bytes = int64_t{resident} * sysconf(_SC_PAGESIZE);
    std::fclose(f);
  }
#ifdef FLOWTRAIN_HAS_CUDA_ALLOCATOR
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.allocated_bytes = stats.allocated_bytes[all].current;
    m.reserved_bytes = stats.reserved_bytes[all].current;
    return m;
  }
#endif
  m.allocated_bytes = live_bytes.load();
  return m;
}

}  // namespace flowtrain::trainer
