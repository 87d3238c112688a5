// A host-side deadline for collectives whose wait() does not block the host. On NCCL, Work::wait()
// only makes the compute stream wait for the communication stream, so a dead or hung peer shows
// up as a later host sync (a loss.item()) that never returns. Every collective issued on such a
// group is registered here with its description; a monitor thread polls completion and, when one
// has been pending for longer than the timeout, reports "<collective> on group <g> did not complete
// within <T> s" through `on_expired`. In a run that ends the process (Runtime: one line on stderr,
// exit status 1, what `flowtrain launch` and Slurm's --kill-on-bad-exit act on); the c10d watchdog
// (TORCH_NCCL_ASYNC_ERROR_HANDLING=3) tears the process down at the same deadline with its own,
// longer report, whichever comes first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace flowtrain::parallel {

class CollectiveWatchdog {
 public:
  using Expired = std::function<void(const std::string& message)>;
  // `on_thread_start` runs first in the monitor thread: NCCL runs set the rank's CUDA device
  // there, or polling CUDA events would create a context on device 0 in that thread.
  CollectiveWatchdog(std::chrono::milliseconds timeout, Expired on_expired,
                     std::chrono::milliseconds poll = std::chrono::milliseconds(500),
                     std::function<void()> on_thread_start = {});
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // `completed` must be cheap and thread-safe (c10d Work::isCompleted is); it is polled from the
  // monitor thread until it returns true.
  void watch(std::string what, std::function<bool()> completed);
  size_t pending() const;

 private:
  struct Entry {
    std::string what;
    std::chrono::steady_clock::time_point issued;
    std::function<bool()> completed;
  };
  void monitor();

  std::chrono::milliseconds timeout_, poll_;
  Expired on_expired_;
  std::function<void()> on_thread_start_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::list<Entry> entries_;
  bool stopping_ = false, fired_ = false;
  std::thread thread_;
};

}  // namespace flowtrain::parallel
