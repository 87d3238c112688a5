#include "parallel/collective_watchdog.h"

#include <fmt/format.h>

#include <vector>

namespace flowtrain::parallel {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::milliseconds timeout, Expired on_expired,
                                       std::chrono::milliseconds poll, std::function<void()> on_thread_start)
    : timeout_(timeout),
      poll_(poll),
      on_expired_(std::move(on_expired)),
      on_thread_start_(std::move(on_thread_start)),
      thread_([this] { monitor(); }) {}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::watch(std::string what, std::function<bool()> completed) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({std::move(what), std::chrono::steady_clock::now(), std::move(completed)});
}

size_t CollectiveWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void CollectiveWatchdog::monitor() {
  if (on_thread_start_) on_thread_start_();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll_, [this] { return stopping_; });
    if (stopping_ || fired_) continue;
    const auto now = std::chrono::steady_clock::now();
    std::string expired;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->completed()) {
        it = entries_.erase(it);
        continue;
      }
      if (expired.empty() && now - it->issued > timeout_) {
        const double waited = std::chrono::duration<double>(now - it->issued).count();
        expired = fmt::format("{} did not complete within the timeout of {:g} s (pending {:.1f} s): a peer died, hung "
                              "or issued a different collective (parallel.timeout_s)",
                              it->what, std::chrono::duration<double>(timeout_).count(), waited);
      }
      ++it;
    }
    if (!expired.empty()) {
      fired_ = true;  // report once; the handler normally ends the process
      lock.unlock();
      on_expired_(expired);
      lock.lock();
    }
  }
}

}  // namespace flowtrain::parallel
