// The host-side deadline of NCCL collectives (parallel/collective_watchdog.h), driven by fake
// completion flags: the GPU path cannot run here, the deadline logic can.
#include "parallel/collective_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

using namespace flowtrain::parallel;
using namespace std::chrono_literals;

namespace {

struct Reports {
  std::mutex mutex;
  std::vector<std::string> messages;
  void add(const std::string& m) {
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(m);
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

// Polls until `done` holds or 20 s pass (a generous bound for a loaded CI machine; the
// deadlines below are 0.3 s).
template <typename F>
bool eventually(F done) {
  for (int i = 0; i < 2000 && !done(); ++i) std::this_thread::sleep_for(10ms);
  return done();
}

}  // namespace

TEST(CollectiveWatchdog, NamesTheCollectiveThatMissedItsDeadlineOnce) {
  Reports reports;
  CollectiveWatchdog watchdog(300ms, [&](const std::string& m) { reports.add(m); }, 20ms);
  std::atomic<bool> quick_done{false};
  watchdog.watch("all_gather on group shard[0,1]", [&] { return quick_done.load(); });
  watchdog.watch("reduce_scatter on group shard[0,1]", [] { return false; });  // the hung one
  quick_done = true;
  ASSERT_TRUE(eventually([&] { return !reports.get().empty(); }));
  std::this_thread::sleep_for(200ms);  // would report again if it could
  const auto messages = reports.get();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("reduce_scatter on group shard[0,1] did not complete within the timeout of 0.3 s"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("parallel.timeout_s"), std::string::npos) << messages[0];
}

TEST(CollectiveWatchdog, CompletedCollectivesAreForgottenAndNeverReported) {
  Reports reports;
  CollectiveWatchdog watchdog(300ms, [&](const std::string& m) { reports.add(m); }, 20ms);
  for (int i = 0; i < 100; ++i) watchdog.watch("all_reduce on group world[0,1]", [] { return true; });
  ASSERT_TRUE(eventually([&] { return watchdog.pending() == 0; }));
  std::this_thread::sleep_for(500ms);  // past the deadline of every entry
  EXPECT_TRUE(reports.get().empty());
}
