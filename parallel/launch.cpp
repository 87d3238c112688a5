#include "parallel/launch.h"
#include "parallel/launcher_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <set>

extern char** environ;

namespace flowtrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
// After SIGKILL a process is gone within milliseconds unless it sits in an uninterruptible
// kernel wait (a hung NFS or GPU driver call); past this the launcher stops waiting for it.
constexpr auto kReapAfterKill = std::chrono::seconds(10);
// Poll period of the wait loop; signals and child exits wake it earlier through the pipe.
constexpr int kPollMs = 200;

// The write end of the wake-up pipe: the one process-global, because signal handlers need it.
std::atomic<int> g_wake_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");

extern "C" void wake_launcher(int sig) {
  const int saved_errno = errno;
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t written = ::write(fd, &byte, 1);  // full pipe: already awake anyway
  }
  errno = saved_errno;
}

// Routes SIGINT/SIGTERM/SIGUSR1/SIGUSR2 (to forward) and SIGCHLD (a rank exited) into a pipe the
// wait loop polls: a self-pipe, because a handler may do almost nothing and signalfd would need
// the signals blocked in every thread of the process. Restores the previous handlers on exit.
// Installing a SIGCHLD handler also undoes an inherited SIG_IGN, under which the kernel would
// reap the ranks itself and their exit codes would be lost.
class SignalRelay {
 public:
  SignalRelay() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw LaunchError(fmt::format("launch: pipe2 failed: {}", std::strerror(errno)));
    int expected = -1;
    if (!g_wake_fd.compare_exchange_strong(expected, fds_[1])) {
      close_pipe();
      throw LaunchError("launch: another launch_local is already running in this process");
    }
    struct sigaction action {};
    action.sa_handler = wake_launcher;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) ::sigaction(kForwardedSignals[i], &action, &previous_[i]);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &action, &previous_chld_);
  }
  ~SignalRelay() {
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) ::sigaction(kForwardedSignals[i], &previous_[i], nullptr);
    ::sigaction(SIGCHLD, &previous_chld_, nullptr);
    g_wake_fd.store(-1);
    close_pipe();
  }
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Sleeps until a signal arrives or `timeout_ms` passes; returns the signals received since the
  // last call, SIGCHLD excluded (its only job is the wake-up), in arrival order.
  std::vector<int> wait(int timeout_ms) {
    pollfd p{fds_[0], POLLIN, 0};
    ::poll(&p, 1, std::max(timeout_ms, 0));  // EINTR is a wake-up like any other
    std::vector<int> signals;
    unsigned char buffer[64];
    ssize_t n;
    while ((n = ::read(fds_[0], buffer, sizeof buffer)) > 0)
      for (ssize_t i = 0; i < n; ++i)
        if (buffer[i] != SIGCHLD) signals.push_back(buffer[i]);
    return signals;
  }

 private:
  void close_pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int fds_[2] = {-1, -1};
  struct sigaction previous_[std::size(kForwardedSignals)]{};
  struct sigaction previous_chld_ {};
};

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(sig);
  }
}

struct Rank {
  int64_t local = 0, global = 0;
  pid_t pid = -1;
  bool running = false;
};

void validate(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) throw LaunchError(fmt::format("--nproc-per-node {} must be >= 1", o.nproc_per_node));
  if (o.nnodes < 1) throw LaunchError(fmt::format("--nnodes {} must be >= 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw LaunchError(fmt::format("--node-rank {} is not in 0..{} (--nnodes {})", o.node_rank, o.nnodes - 1, o.nnodes));
  if (o.master_port < 0 || o.master_port > 65535)
    throw LaunchError(fmt::format("--master-port {} is not a TCP port (1..65535, or 0 to pick one)", o.master_port));
  if (o.master_port == 0 && o.nnodes > 1)
    throw LaunchError(fmt::format("--master-port is required with --nnodes {}: every node must agree on it", o.nnodes));
  if (o.master_addr.empty()) throw LaunchError("--master-addr is empty");
  if (!(o.grace_seconds >= 0)) throw LaunchError(fmt::format("--grace-seconds {} must be >= 0", o.grace_seconds));
  if (o.command.empty()) throw LaunchError("no command to launch (give it after --)");
  if (::access(o.command[0].c_str(), X_OK) != 0)
    throw LaunchError(fmt::format("cannot execute {}: {}", o.command[0], std::strerror(errno)));
}

// The parent's environment without the variables the launcher sets, then those, as KEY=VALUE.
std::vector<std::string> rank_environment(const LaunchOptions& o, int master_port, const Rank& rank) {
  const int64_t world = o.nproc_per_node * o.nnodes;
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank.global)},          {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_RANK", std::to_string(rank.local)},     {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"NODE_RANK", std::to_string(o.node_rank)},     {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)}, {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(master_port)},   {"FLOWTRAIN_LAUNCH", "1"},
  };
  // Node 0's launcher hosts the store (launch_local); every rank is its client.
  for (auto& kv : launcher_store_environment()) ours.push_back(std::move(kv));
  std::set<std::string> names;
  for (const auto& kv : ours) names.insert(kv.first);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (!names.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// fork + execve. Everything the child needs is built before the fork: between fork and exec
// only async-signal-safe calls are allowed (the parent may have other threads, e.g. in tests).
pid_t spawn(const LaunchOptions& o, int master_port, const Rank& rank) {
  std::vector<std::string> argv_strings = o.command;
  std::vector<std::string> env_strings = rank_environment(o, master_port, rank);
  std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env_strings);
  const std::string exec_failed =
      fmt::format("flowtrain launch: rank {}: cannot execute {}\n", rank.global, o.command[0]);

  // Blocked across the fork, so the child cannot run the relay's handler (and wake the
  // parent's pipe) before it has reset the handlers to their defaults.
  sigset_t block, previous;
  sigemptyset(&block);
  for (int sig : kForwardedSignals) sigaddset(&block, sig);
  sigaddset(&block, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &block, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A launcher killed outright (OOM killer, kill -9) must not leave ranks running that would
    // wait for their dead peers until the collective timeout.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(128 + SIGKILL);
    for (int sig : kForwardedSignals) ::signal(sig, SIG_DFL);
    ::signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) throw LaunchError(fmt::format("fork for rank {} failed: {}", rank.global, std::strerror(fork_errno)));
  return pid;
}

void signal_running(std::vector<Rank>& ranks, int sig) {
  for (const Rank& r : ranks)
    if (r.running) ::kill(r.pid, sig);
}

int64_t count_running(const std::vector<Rank>& ranks) {
  return std::count_if(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; });
}

// The supervisor: forwards signals, reaps ranks, and after the first failure tears the node down
// within grace + kReapAfterKill.
class Supervisor {
 public:
  Supervisor(std::vector<Rank>& ranks, double grace_seconds) : ranks_(ranks), grace_seconds_(grace_seconds) {}

  // Records a failure that is not a rank's exit (a fork that failed) and starts the teardown.
  void fail(int code, const std::string& why) {
    if (first_failure_) return;
    first_failure_ = code;
    const int64_t running = count_running(ranks_);
    if (running == 0) {
      spdlog::error("[launch] {}", why);
    } else {
      spdlog::error("[launch] {}; stopping the {} running rank(s): SIGTERM now, SIGKILL after {} s", why, running,
                    grace_seconds_);
    }
    signal_running(ranks_, SIGTERM);
    kill_at_ =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds_));
  }

  int run(SignalRelay& relay) {
    while (true) {
      reap();
      if (count_running(ranks_) == 0) break;
      const auto now = Clock::now();
      if (kill_at_ && !give_up_at_ && now >= *kill_at_) {
        spdlog::warn("[launch] {} rank(s) still running {} s after SIGTERM; sending SIGKILL", count_running(ranks_),
                     grace_seconds_);
        signal_running(ranks_, SIGKILL);
        give_up_at_ = now + kReapAfterKill;
      }
      if (give_up_at_ && now >= *give_up_at_) {
        for (const Rank& r : ranks_)
          if (r.running)
            spdlog::error("[launch] rank {} (pid {}) survived SIGKILL; not waiting for it", r.global, r.pid);
        break;
      }
      int timeout_ms = kPollMs;
      for (const auto& deadline : {kill_at_, give_up_at_})
        if (deadline && *deadline > now)
          timeout_ms = std::min<int64_t>(
              timeout_ms, std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count() + 1);
      for (int sig : relay.wait(timeout_ms)) {
        spdlog::info("[launch] received {}; forwarding it to {} running rank(s)", signal_name(sig),
                     count_running(ranks_));
        signal_running(ranks_, sig);
      }
    }
    if (!first_failure_) spdlog::info("[launch] all {} ranks exited with code 0", ranks_.size());
    return first_failure_.value_or(0);
  }

 private:
  void reap() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      const pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      r.running = false;
      if (got < 0) {  // ECHILD: reaped behind our back, so its exit code is unknown
        fail(1, fmt::format("rank {} (pid {}) vanished: waitpid: {}", r.global, r.pid, std::strerror(errno)));
        continue;
      }
      const bool signaled = WIFSIGNALED(status);
      const int code = signaled ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      const std::string what = signaled ? fmt::format("rank {} (pid {}) was killed by {} (exit code {})", r.global,
                                                      r.pid, signal_name(WTERMSIG(status)), code)
                                        : fmt::format("rank {} (pid {}) exited with code {}", r.global, r.pid, code);
      if (code == 0) {
        spdlog::info("[launch] {}", what);
      } else if (first_failure_) {
        spdlog::info("[launch] {} (after the first failure)", what);
      } else {
        fail(code, what);
      }
    }
  }

  std::vector<Rank>& ranks_;
  double grace_seconds_;
  std::optional<int> first_failure_;
  std::optional<Clock::time_point> kill_at_, give_up_at_;
};

}  // namespace

int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw LaunchError(fmt::format("launch: socket failed: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;  // the kernel picks
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    throw LaunchError(fmt::format("launch: cannot find a free port: {}", std::strerror(err)));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::optional<int64_t> default_node_rank(const EnvLookup& env) {
  for (const char* name : {"JOB_COMPLETION_INDEX", "SLURM_NODEID"}) {
    const std::optional<std::string> s = env(name);
    if (!s || s->empty()) continue;
    int64_t value = 0;
    const char* end = s->data() + s->size();
    auto [ptr, ec] = std::from_chars(s->data(), end, value);
    if (ec != std::errc() || ptr != end || value < 0)
      throw DistEnvError(fmt::format("{}=\"{}\" is not a non-negative integer", name, *s));
    return value;
  }
  return std::nullopt;
}

int launch_local(const LaunchOptions& options) {
  validate(options);
  // Node 0 hosts the ranks' rendezvous store before any rank exists, on the port it hands them
  // (parallel/launcher_store.h): a port picked and released here could be taken before rank 0
  // bound it. The other nodes' ranks connect to it at --master-addr:--master-port.
  std::unique_ptr<LauncherStore> store;
  int master_port = options.master_port;
  if (options.node_rank == 0) {
    try {
      store = std::make_unique<LauncherStore>(options.master_port);
    } catch (const std::runtime_error& e) {
      throw LaunchError(fmt::format("launch: {} (--master-port)", e.what()));
    }
    master_port = store->port();
  }
  const int64_t world = options.nproc_per_node * options.nnodes;
  std::string command_line;
  for (const std::string& arg : options.command) command_line += (command_line.empty() ? "" : " ") + arg;
  spdlog::info("[launch] node {}/{}: starting ranks {}..{} of {}, master {}:{}: {}", options.node_rank, options.nnodes,
               options.node_rank * options.nproc_per_node, (options.node_rank + 1) * options.nproc_per_node - 1, world,
               options.master_addr, master_port, command_line);

  SignalRelay relay;  // before the first fork: a signal during start-up still reaches every rank
  std::vector<Rank> ranks;
  ranks.reserve(options.nproc_per_node);
  Supervisor supervisor(ranks, options.grace_seconds);
  for (int64_t local = 0; local < options.nproc_per_node; ++local) {
    Rank r;
    r.local = local;
    r.global = options.node_rank * options.nproc_per_node + local;
    try {
      r.pid = spawn(options, master_port, r);
    } catch (const LaunchError& e) {
      supervisor.fail(1, e.what());  // tear down the ranks already started
      break;
    }
    r.running = true;
    ranks.push_back(r);
  }
  return supervisor.run(relay);
}

}  // namespace flowtrain::parallel
