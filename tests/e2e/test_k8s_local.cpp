// configs/k8s run locally: the pods' command (entrypoint.sh from the ConfigMap → flowtrain launch
// → flowtrain train) with exactly the environment indexed-job.yaml gives its pods, addresses
// mapped to loopback, as plain processes of this build's binary on a tiny CPU config.
//
// What differs from a real pod, and why:
//   - MASTER_ADDR's host becomes 127.0.0.1 (no cluster DNS) and MASTER_PORT a free port (tests
//     run in parallel on one host);
//   - NPROC_PER_NODE = 1 and WORLD_SIZE = NNODES (CPU: one rank per "pod" instead of one per GPU);
//   - the ConfigMap's mount directory and the binary come from the scratch directory and this
//     build (a symlink `flowtrain` first on PATH);
//   - `--set` overrides shrink the config to the tiny CPU run of tests/configs/tiny_fashion.yaml
//     (model, batch, steps, device, data and run directory, one data-parallel group).
#include "cli_runner.h"
#include "parallel/launch.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

YAML::Node load_doc(const std::string& file, const std::string& kind) {
  for (const YAML::Node& n : YAML::LoadAllFromFile(source_path("configs/k8s/" + file)))
    if (n && n["kind"] && n["kind"].as<std::string>() == kind) return n;
  throw std::runtime_error("no " + kind + " in configs/k8s/" + file);
}

// A pod of indexed-job.yaml as a local process group: the container's command and env, with
// the substitutions listed at the top of this file.
class LocalPods {
 public:
  explicit LocalPods(const std::string& scratch) : scratch_(scratch) {
    const YAML::Node job = load_doc("indexed-job.yaml", "Job");
    const YAML::Node configmap = load_doc("configmap.yaml", "ConfigMap");
    YAML::Node container;
    for (const YAML::Node& c : job["spec"]["template"]["spec"]["containers"])
      if (c["name"].as<std::string>() == "trainer") container = c;
    if (!container) throw std::runtime_error("indexed-job.yaml has no container named trainer");

    // The ConfigMap's files, where the pod mounts them (mapped into the scratch directory).
    std::string mount;
    for (const YAML::Node& m : container["volumeMounts"])
      if (m["name"].as<std::string>() == "config") mount = m["mountPath"].as<std::string>();
    if (mount.empty()) throw std::runtime_error("the config volume is not mounted");
    const std::string local_mount = scratch_ + "/configmap";
    fs::create_directories(local_mount);
    for (const auto& kv : configmap["data"])
      write_file(local_mount + "/" + kv.first.as<std::string>(), kv.second.as<std::string>());
    const auto map_path = [&](std::string s) {
      if (s.rfind(mount, 0) == 0) s = local_mount + s.substr(mount.size());
      return s;
    };

    for (const YAML::Node& e : container["env"]) env_[e["name"].as<std::string>()] = map_path(e["value"].as<std::string>());
    const std::string addr = env_.at("MASTER_ADDR");
    master_host_ = addr.substr(0, addr.find(':'));
    env_["MASTER_ADDR"] = "127.0.0.1";
    env_["MASTER_PORT"] = std::to_string(flowtrain::parallel::pick_free_port());
    env_["NPROC_PER_NODE"] = "1";

    for (const YAML::Node& a : container["command"]) command_.push_back(map_path(a.as<std::string>()));
    for (const YAML::Node& a : container["args"]) command_.push_back(map_path(a.as<std::string>()));

    // `flowtrain` on PATH is this build.
    fs::create_directories(scratch_ + "/bin");
    fs::create_symlink(FLOWTRAIN_BINARY, scratch_ + "/bin/flowtrain");
  }

  // NNODES pods of NPROC_PER_NODE = 1 rank each (the manifest's node count, or fewer).
  void set_nodes(int64_t n) {
    env_["NNODES"] = std::to_string(n);
    env_["WORLD_SIZE"] = std::to_string(n);
  }
  void set_env(const std::string& name, const std::string& value) { env_[name] = value; }
  const std::string& master_host() const { return master_host_; }

  // Starts pod `index` (JOB_COMPLETION_INDEX) with extra container args; output to `log`.
  pid_t start(int64_t index, const std::vector<std::string>& extra_args, const std::string& log) {
    std::vector<std::string> env_strings;
    // Nothing of the test's own environment leaks in (a ctest under srun has SLURM_* set).
    env_strings.push_back("PATH=" + scratch_ + "/bin:/usr/local/bin:/usr/bin:/bin");
    if (const char* ld = std::getenv("LD_LIBRARY_PATH")) env_strings.push_back(std::string("LD_LIBRARY_PATH=") + ld);
    for (const auto& [k, v] : env_) env_strings.push_back(k + "=" + v);
    env_strings.push_back("JOB_COMPLETION_INDEX=" + std::to_string(index));  // set by Kubernetes
    std::vector<std::string> argv = command_;
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());

    // Everything the child needs is built before fork (no allocation between fork and exec).
    std::vector<char*> a, e;
    for (auto& v : argv) a.push_back(v.data());
    a.push_back(nullptr);
    for (auto& v : env_strings) e.push_back(v.data());
    e.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      ::execvpe(a[0], a.data(), e.data());
      _exit(127);
    }
    return pid;
  }

 private:
  std::string scratch_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> command_;
  std::string master_host_;
};

// The exit code of `pid` (128 + signal for a signal death); SIGKILLs it after `timeout_s`.
int wait_exit(pid_t pid, double timeout_s = 300) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "pid " << pid << " ran longer than " << timeout_s << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool wait_for_text(const std::string& file, const std::string& text, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(file) && read_file(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The tiny CPU run (tests/configs/tiny_fashion.yaml's model and batch) as container args.
std::vector<std::string> tiny_cpu_args(const std::string& out_dir, int64_t steps) {
  std::vector<std::string> sets = {"run.device=cpu", "run.out_dir=" + out_dir, "data.path=" + fashion_mnist_dir(),
                                   "model.hidden=64", "model.depth=2", "model.heads=2", "data.batch_size=32",
                                   "data.workers=1", "train.precision=fp32", "train.threads=1",
                                   "train.log_every=1", "train.steps=" + std::to_string(steps), "sample.every=0",
                                   "checkpoint.every=0", "parallel.dp_replicate=1", "parallel.dp_shard=-1"};
  std::vector<std::string> args;
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

// Only the trainer's step lines contain this ("step  1/4 | loss 1.67 | …").
const char* const kStepLine = " | loss ";

std::string manifest(const std::string& run, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%07d", static_cast<int>(step));
  return run + "/checkpoints/" + name + "/manifest.json";
}

}  // namespace

// Two pods (JOB_COMPLETION_INDEX 0 and 1) rendezvous through the manifest's MASTER_ADDR (mapped
// to loopback), train as ranks 0 and 1, and both exit 0 with rank 0's checkpoint written.
TEST(K8sLocal, TwoPodsWithTheManifestsEnvironmentTrain) {
  REQUIRE_DATA();
  const std::string scratch = scratch_dir("k8s_two_pods");
  LocalPods pods(scratch);
  EXPECT_EQ(pods.master_host(), load_doc("indexed-job.yaml", "Job")["metadata"]["name"].as<std::string>() + "-0." +
                                    load_doc("headless-service.yaml", "Service")["metadata"]["name"].as<std::string>());
  pods.set_nodes(2);
  const std::string run = scratch + "/run";
  const pid_t p0 = pods.start(0, tiny_cpu_args(run, 4), scratch + "/pod0.log");
  const pid_t p1 = pods.start(1, tiny_cpu_args(run, 4), scratch + "/pod1.log");
  const int rc0 = wait_exit(p0), rc1 = wait_exit(p1);
  const std::string log0 = read_file(scratch + "/pod0.log"), log1 = read_file(scratch + "/pod1.log");
  EXPECT_EQ(rc0, 0) << log0;
  EXPECT_EQ(rc1, 0) << log1;
  EXPECT_NE(log0.find("[rank 0]"), std::string::npos) << log0;
  EXPECT_NE(log1.find("[rank 1]"), std::string::npos) << log1;
  EXPECT_TRUE(fs::exists(manifest(run, 4))) << log0;
}

// SIGTERM to one pod (an eviction): both pods' ranks checkpoint at the same step and stop; the
// signalled pod exits 143 at once, the other one (no signal, no final checkpoint) exits 143 after
// FINAL_CHECKPOINT_WAIT_S, so Kubernetes replaces both instead of counting the run as finished.
TEST(K8sLocal, SigtermToOnePodStopsBothWith143AndACheckpoint) {
  REQUIRE_DATA();
  const std::string scratch = scratch_dir("k8s_sigterm_two_pods");
  LocalPods pods(scratch);
  pods.set_nodes(2);
  pods.set_env("FINAL_CHECKPOINT_WAIT_S", "3");
  const std::string run = scratch + "/run";
  const pid_t p0 = pods.start(0, tiny_cpu_args(run, 100000), scratch + "/pod0.log");
  const pid_t p1 = pods.start(1, tiny_cpu_args(run, 100000), scratch + "/pod1.log");
  const bool training = wait_for_text(scratch + "/pod0.log", kStepLine, 120);
  EXPECT_TRUE(training) << read_file(scratch + "/pod0.log");
  kill(p1, SIGTERM);
  const int rc0 = wait_exit(p0, 120), rc1 = wait_exit(p1, 120);
  EXPECT_EQ(rc1, 143) << read_file(scratch + "/pod1.log");
  EXPECT_EQ(rc0, 143) << read_file(scratch + "/pod0.log");
  bool checkpoint = false;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    checkpoint |= fs::exists(e.path() / "manifest.json") && e.path().extension().empty();
  EXPECT_TRUE(checkpoint) << read_file(scratch + "/pod0.log");
}

// One pod (NNODES=1; no distributed runtime needed): the entrypoint's exit codes. A finished run
// exits 0; SIGTERM (what Kubernetes sends on eviction) makes the rank checkpoint and the pod
// exit 143, and a new pod resumes from that checkpoint.
TEST(K8sLocal, OnePodFinishesWith0AndStopsWith143) {
  REQUIRE_DATA();
  const std::string scratch = scratch_dir("k8s_one_pod");
  LocalPods pods(scratch);
  pods.set_nodes(1);
  const std::string run = scratch + "/run";

  const pid_t stopped = pods.start(0, tiny_cpu_args(run, 100000), scratch + "/stopped.log");
  ASSERT_TRUE(wait_for_text(scratch + "/stopped.log", kStepLine, 120)) << read_file(scratch + "/stopped.log");
  kill(stopped, SIGTERM);
  const int stopped_rc = wait_exit(stopped, 120);
  const std::string log = read_file(scratch + "/stopped.log");
  EXPECT_EQ(stopped_rc, 143) << log;
  EXPECT_NE(log.find("received signal"), std::string::npos) << log;

  int64_t saved = 0;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension().empty() && fs::exists(e.path() / "manifest.json"))
      saved = std::max<int64_t>(saved, std::stoll(name.substr(5)));
  }
  ASSERT_GT(saved, 0) << log;

  const pid_t finished = pods.start(0, tiny_cpu_args(run, saved + 2), scratch + "/finished.log");
  const int rc = wait_exit(finished, 120);
  const std::string flog = read_file(scratch + "/finished.log");
  EXPECT_EQ(rc, 0) << flog;
  EXPECT_NE(flog.find("resumed from"), std::string::npos) << flog;
  EXPECT_TRUE(fs::exists(manifest(run, saved + 2))) << flog;
}
