#include "rank_runner.h"

#include "test_util.h"

#include "parallel/launcher_store.h"
#include "parallel/runtime.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <thread>

namespace flowtrain::test {

std::vector<int> start_ranks(const RankJob& job, const parallel::LauncherStore& store) {
  std::vector<int> pids;
  for (int r = 0; r < job.world; ++r) {
    std::string cmd = "exec env RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(job.world) +
                      " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(job.world) +
                      " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(store.port());
    for (const auto& [name, value] : parallel::launcher_store_environment()) cmd += " " + name + "=" + value;
    for (const auto& e : job.extra_env) cmd += " " + e;
    if (r < static_cast<int>(job.rank_env.size())) cmd += " " + job.rank_env[r];
    cmd += " " + std::string(FLOWTRAIN_BINARY) + " " + job.args + " > " + job.log_dir + "/rank-" + std::to_string(r) +
           ".log 2>&1";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  return pids;
}

std::vector<RankResult> wait_ranks(const RankJob& job, const std::vector<int>& pids) {
  std::vector<RankResult> results(pids.size());
  std::vector<bool> done(pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + job.deadline;
  size_t remaining = pids.size();
  while (remaining > 0) {
    for (size_t r = 0; r < pids.size(); ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        done[r] = true;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          results[r].exit_code = -1;
          done[r] = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t r = 0; r < pids.size(); ++r) results[r].output = read_file(job.log_dir + "/rank-" + std::to_string(r) + ".log");
  return results;
}

std::string read_if_exists(const std::string& path) {
  return access(path.c_str(), R_OK) == 0 ? read_file(path) : std::string();
}

bool wait_for_step(const std::string& log, int step, std::chrono::seconds timeout) {
  const std::regex line("step +" + std::to_string(step) + "/");
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!std::regex_search(read_if_exists(log), line)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

KillOnExit::~KillOnExit() {
  for (int pid : pids) {
    if (waitpid(pid, nullptr, WNOHANG) != 0) continue;  // already reaped (or not our child)
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

std::vector<RankResult> run_ranks(const RankJob& job) {
  const parallel::LauncherStore store(0);
  return wait_ranks(job, start_ranks(job, store));
}

std::string tiny_train_args(const std::string& out_dir, const std::vector<std::string>& sets, const std::string& arch) {
  std::string args = "train -c " + tiny_config(arch) + " --set run.out_dir=" + out_dir +
                     " --set data.path=" + fashion_mnist_dir();
  for (const auto& s : sets) args += " --set " + s;
  return args;
}

std::vector<std::string> run_thread_ranks(int world, parallel::MeshShape mesh,
                                          const std::function<void(int rank, parallel::Runtime& runtime)>& body) {
  // The store listens before any rank starts (on a port the kernel picks): rank 0 binding a port
  // picked and released earlier could lose it to another test's sockets in between.
  const parallel::LauncherStore store(0);
  return run_thread_ranks(world, mesh, store.port(), /*attempt=*/0, body);
}

std::vector<std::string> run_thread_ranks(int world, parallel::MeshShape mesh, int store_port, int64_t attempt,
                                          const std::function<void(int rank, parallel::Runtime& runtime)>& body) {
  // The ranks here are threads of one process and share torch's process-wide flight recorder,
  // whose first record of each group writes a std::map outside its lock (torch 2.11): ranks
  // creating their groups at the same moment race on it (a rare segfault). Real ranks are
  // processes, each creating its groups on one thread (parallel/comm_c10d.cpp), so the harness
  // alone turns it off, before this process makes its first group.
  setenv("TORCH_FR_BUFFER_SIZE", "0", 1);
  std::vector<std::string> errors(world);
  auto rank_main = [&](int rank) {
    try {
      parallel::RuntimeOptions ro;
      ro.env.rank = rank;
      ro.env.world = world;
      ro.env.master_addr = "127.0.0.1";
      ro.env.master_port = store_port;
      ro.env.launcher_store = true;
      ro.env.store_attempt = attempt;
      ro.mesh = mesh;
      ro.backend = "gloo";
      ro.timeout_s = 60;
      auto runtime = parallel::Runtime::create(ro);
      body(rank, *runtime);
      runtime->world_group().barrier();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::vector<std::thread> others;
  for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
  rank_main(0);
  for (auto& t : others) t.join();
  return errors;
}

}  // namespace flowtrain::test
