// Shards in an object store, read natively (s3://bucket/key, SigV4-signed by libcurl): a real S3
// server on loopback (moto's, tests/s3_server.py, authentication enforced) holds packed
// Fashion-MNIST shards; `data inspect` reads one, training from s3:// entries sees the same
// batches as from the local files (same losses), and a wrong secret is one error naming the
// object, the endpoint and where the credentials came from — never the secret. A glob entry
// (s3://bucket/dir/train-*.tar) is listed page by page.
#include "cli_runner.h"
#include "data/data_error.h"
#include "data/shards/s3.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

std::string moto_python() {
  const char* deps = std::getenv("FLOWTRAIN_DEPS");
  const char* home = std::getenv("HOME");
  return (deps ? std::string(deps) : std::string(home ? home : "") + "/.cache/flowtrain") + "/moto-venv/bin/python";
}

// tests/s3_server.py in a child process: serves until this object closes its standard input.
class S3Server {
 public:
  S3Server(const std::string& bucket, const std::vector<std::pair<std::string, std::string>>& uploads,
           bool faults = false) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    std::vector<std::string> args = {moto_python(), source_path("tests/s3_server.py"), "--bucket", bucket};
    for (const auto& [local, key] : uploads) {
      args.push_back("--upload");
      args.push_back(local + "=" + key);
    }
    if (faults) args.push_back("--faults");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      const int null = open("/dev/null", O_WRONLY);  // the server's request log
      if (null >= 0) dup2(null, STDERR_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    stdin_ = to_child[1];
    FILE* out = fdopen(from_child[0], "r");
    char line[4096];
    while (fgets(line, sizeof line, out)) {  // its request log goes to stderr; the JSON line to stdout
      if (line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line);
      endpoint = j["endpoint"];
      access_key = j["access_key"];
      secret_key = j["secret_key"];
      break;
    }
    fclose(out);
  }
  ~S3Server() {
    if (stdin_ >= 0) close(stdin_);  // the server stops
    if (pid_ > 0) {
      for (int i = 0; i < 50 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) usleep(100000);
      if (kill(pid_, 0) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
  }
  bool running() const { return !endpoint.empty(); }
  std::string env(const std::string& secret) const {
    return "AWS_ACCESS_KEY_ID=" + access_key + " AWS_SECRET_ACCESS_KEY='" + secret + "' AWS_ENDPOINT_URL=" + endpoint +
           " AWS_REGION=us-east-1";
  }

  std::string endpoint, access_key, secret_key;

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
};

}  // namespace

#define REQUIRE_MOTO()                                                                                \
  do {                                                                                               \
    if (!fs::exists(moto_python())) {                                                                \
      if (in_ci()) FAIL() << moto_python() << " is missing: scripts/setup.sh installs moto[server] there"; \
      GTEST_SKIP() << "no moto venv at " << moto_python() << " (run scripts/setup.sh)";              \
    }                                                                                                \
  } while (0)

namespace {

// 300 Fashion-MNIST samples packed into base/shards (3 shards and index.json); the uploads that
// put the shards under fashion/ in the bucket.
std::vector<std::pair<std::string, std::string>> pack_fashion_shards(const std::string& base) {
  auto packed = run_flowtrain("data pack --from fashion-mnist --path " + fashion_mnist_dir() + " --out " + base +
                              "/shards --limit 300 --max-count 100");
  EXPECT_EQ(packed.exit_code, 0) << packed.output;
  std::vector<std::pair<std::string, std::string>> uploads;
  for (int s = 0; s < 3; ++s) {
    const std::string name = "train-00000" + std::to_string(s) + ".tar";
    uploads.emplace_back(base + "/shards/" + name, "fashion/" + name);
  }
  return uploads;
}

// A 4-step run of the tiny DiT from `shards` (sample counts from the local index.json).
CommandResult train_from(const std::string& base, const std::string& run, const std::string& shards,
                         const std::string& env) {
  return train_tiny(base + "/" + run,
                    {"data.source=shards", "data.streams=3", "train.threads=1", "train.log_every=1", "train.steps=4",
                     "data.shard_index=" + base + "/shards/index.json", "data.shards=" + shards},
                    env);
}

void expect_same_losses(const std::string& run_a, const std::string& run_b) {
  const auto a = read_metrics(run_a), b = read_metrics(run_b);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a[i].at("loss").get<double>(), b[i].at("loss").get<double>()) << i;
}

}  // namespace

TEST(ObjectStore, TrainsFromS3ShardsAsFromLocalFilesAndAWrongSecretIsOneErrorWithoutIt) {
  REQUIRE_DATA();
  REQUIRE_MOTO();
  const std::string base = scratch_dir("object_store");
  auto uploads = pack_fashion_shards(base);
  // Beside them, keys a glob must not take: another suffix, and a deeper folder.
  uploads.emplace_back(base + "/shards/index.json", "fashion/index.json");
  uploads.emplace_back(base + "/shards/train-000000.tar", "fashion/old/train-000009.tar");
  const S3Server server("shards", uploads);
  ASSERT_TRUE(server.running()) << "the S3 server did not start (" << moto_python() << " tests/s3_server.py)";

  auto inspect = run_flowtrain("data inspect --summary s3://shards/fashion/train-000000.tar", server.env(server.secret_key));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("100 samples (100 .cls, 100 .png, 100 .txt)"), std::string::npos) << inspect.output;

  // Listing: ListObjectsV2 page by page (2 keys a page here: 5 keys under the prefix, 3 pages),
  // the glob's * not crossing '/'.
  const flowtrain::data::EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    if (name == "AWS_ACCESS_KEY_ID") return server.access_key;
    if (name == "AWS_SECRET_ACCESS_KEY") return server.secret_key;
    if (name == "AWS_ENDPOINT_URL") return server.endpoint;
    return std::nullopt;
  };
  EXPECT_EQ(flowtrain::data::list_objects("shards", "fashion/", false, {}, env, 2).size(), 5u);
  EXPECT_EQ(flowtrain::data::expand_object_glob("s3://shards/fashion/train-*.tar", {}, env, 2),
            (std::vector<std::string>{"s3://shards/fashion/train-000000.tar", "s3://shards/fashion/train-000001.tar",
                                      "s3://shards/fashion/train-000002.tar"}));
  try {
    flowtrain::data::expand_object_glob("s3://shards/fashion/val-*.tar", {}, env);
    ADD_FAILURE() << "a glob matching nothing must be an error";
  } catch (const flowtrain::data::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("s3://shards/fashion/val-*.tar matches no object"), std::string::npos) << e.what();
  }

  // The same run from the local files and from the store: the same batches, so the same losses.
  auto local = train_from(base, "local", base + "/shards/train-{000000..000002}.tar", "");
  ASSERT_EQ(local.exit_code, 0) << local.output;
  auto remote = train_from(base, "remote", "s3://shards/fashion/train-*.tar", server.env(server.secret_key));
  ASSERT_EQ(remote.exit_code, 0) << remote.output;
  expect_same_losses(base + "/local", base + "/remote");

  // A wrong secret: the server refuses the signature (403); one message names the object, the
  // endpoint and the credentials' source, and the secret appears nowhere in the output.
  const std::string wrong = "WRONG-" + server.secret_key.substr(0, 8);
  auto denied = run_flowtrain("data inspect --summary s3://shards/fashion/train-000000.tar", server.env(wrong));
  EXPECT_EQ(denied.exit_code, 1) << denied.output;
  EXPECT_NE(denied.output.find("s3://shards/fashion/train-000000.tar: HTTP 403 (access denied at " + server.endpoint +
                               " with the credentials of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"),
            std::string::npos)
      << denied.output;
  EXPECT_EQ(denied.output.find(wrong), std::string::npos) << denied.output;
  EXPECT_EQ(denied.output.find(server.secret_key), std::string::npos) << denied.output;
  auto denied_run = train_from(base, "denied", "s3://shards/fashion/train-{000000..000002}.tar", server.env(wrong));
  EXPECT_NE(denied_run.exit_code, 0) << denied_run.output;
  EXPECT_EQ(denied_run.output.find(wrong), std::string::npos) << denied_run.output;
  for (const char* f : {"/denied/metrics.jsonl", "/denied/config.yaml"})
    if (fs::exists(base + f)) EXPECT_EQ(read_file(base + f).find(wrong), std::string::npos) << f;
}

TEST(ObjectStore, ThrottlingAnswersAndAConnectionCutMidObjectAreRetriedToTheSameBytes) {
  // Through tests/s3_server.py's fault proxy: every object's first GET is a 503 SlowDown, and
  // train-000001.tar's next one breaks after half its bytes — the reads retry with backoff and
  // resume with a Range request, so training sees exactly the bytes of the local files.
  REQUIRE_DATA();
  REQUIRE_MOTO();
  const std::string base = scratch_dir("object_store_faults");
  const S3Server server("shards", pack_fashion_shards(base), /*faults=*/true);
  ASSERT_TRUE(server.running()) << "the S3 server did not start (" << moto_python() << " tests/s3_server.py)";
  auto local = train_from(base, "local", base + "/shards/train-{000000..000002}.tar", "");
  ASSERT_EQ(local.exit_code, 0) << local.output;
  auto remote = train_from(base, "remote", "s3://shards/fashion/train-*.tar", server.env(server.secret_key));
  ASSERT_EQ(remote.exit_code, 0) << remote.output;
  expect_same_losses(base + "/local", base + "/remote");
}
