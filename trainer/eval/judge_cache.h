// What a judge loads once per process for one (data set, classifier cache, device): its trained
// classifier, the real side of its metrics, references by N. Every user of one cache shares its
// classifier module, so they hold the cache's lock while they score.
#pragma once

#include "trainer/eval/classifier_cache.h"

#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace flowtrain::trainer {

template <class Context>
class JudgeCache {
 public:
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

  // The context of (data_dir, classifier_dir, device), made by `make` on first use. The caller
  // holds lock(). classifier_dir "" is the default cache (classifier_cache.h), the same key.
  Context& get(const std::string& data_dir, const std::string& classifier_dir, const c10::Device& device,
               const std::function<std::unique_ptr<Context>()>& make) {
    const std::string key =
        data_dir + "|" + (classifier_dir.empty() ? default_classifier_dir() : classifier_dir) + "|" + device.str();
    std::unique_ptr<Context>& slot = contexts_[key];
    if (!slot) slot = make();
    return *slot;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Context>> contexts_;
};

}  // namespace flowtrain::trainer
