// The rendezvous store hosted by a launcher for the ranks it starts — what torchrun's agent does
// (its "agent store"). The launcher listens before any rank exists, so the port it hands them is
// one it already holds: with port 0 the kernel picks it at listen time, and no other process can
// take it between picking and use (picking a free port, closing it and letting rank 0 bind it
// later leaves that window open, and on a busy node something else may take the port).
//
// Ranks learn of it from TORCHELASTIC_USE_AGENT_STORE=True (parallel/env.h): all of them connect
// as clients, keys prefixed by their attempt. The store lives as long as this object.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain::parallel {

class LauncherStore {
 public:
  // Listens on every interface at `port` (0: one the kernel picks). Throws std::runtime_error
  // naming the port when it cannot listen there (in use, no permission).
  explicit LauncherStore(int port);
  ~LauncherStore();
  LauncherStore(const LauncherStore&) = delete;
  LauncherStore& operator=(const LauncherStore&) = delete;

  int port() const;  // the port it listens on

 private:
  struct Impl;  // keeps the c10d headers in comm_launcher_store.cpp
  std::unique_ptr<Impl> impl_;
};

// What a launcher sets in its ranks' environment so they use its store (read back by
// resolve_dist_env): torchrun's names, first attempt.
inline std::vector<std::pair<std::string, std::string>> launcher_store_environment() {
  return {{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "0"}};
}

}  // namespace flowtrain::parallel
