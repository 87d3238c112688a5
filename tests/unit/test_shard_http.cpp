// Shards over HTTP: a local `python3 -m http.server` started by the test serves packed shards;
// the loader reads the same batches as from the files. A refused connection is retried and then
// named; a 404 is final at once.
#include "data/data_error.h"
#include "data/png.h"
#include "data/shards/byte_stream.h"
#include "data/shards/shard_index.h"
#include "data/shards/shard_loader.h"
#include "data/shards/tar.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>

using namespace flowtrain::data;
using flowtrain::test::data_error_message;
using flowtrain::test::scratch_dir;

namespace {

// `python3 -m http.server` on an ephemeral port, serving `dir`; stopped with the object.
class HttpServer {
 public:
  explicit HttpServer(const std::string& dir) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      execlp("python3", "python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", dir.c_str(),
             static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    FILE* out = fdopen(fds[0], "r");
    char line[512];
    while (fgets(line, sizeof line, out)) {
      std::cmatch m;
      if (std::regex_search(line, m, std::regex("port ([0-9]+)"))) {
        port_ = std::stoi(m[1].str());
        break;
      }
    }
    output_ = out;  // kept open: the server's request log goes there (and is drained by nobody)
  }
  ~HttpServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    if (output_) fclose(output_);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  FILE* output_ = nullptr;
};

bool have_python3() { return std::system("python3 -c pass >/dev/null 2>&1") == 0; }

}  // namespace

// Built without libcurl (optional; scripts/setup.sh installs it): http(s) shards are an error
// that says so. CI must have it.
#ifndef FLOWTRAIN_HAVE_CURL
#define REQUIRE_CURL()                                                                         \
  do {                                                                                         \
    if (flowtrain::test::in_ci()) FAIL() << "CI builds with libcurl (scripts/setup.sh)";        \
    GTEST_SKIP() << "built without libcurl";                                                   \
  } while (0)
#else
#define REQUIRE_CURL() \
  do {                 \
  } while (0)
#endif

TEST(ShardHttp, LoaderReadsTheSameBatchesOverHttpAsFromFiles) {
  REQUIRE_CURL();
  if (!have_python3()) {
    if (flowtrain::test::in_ci()) FAIL() << "python3 is needed for the local HTTP server";
    GTEST_SKIP() << "python3 not installed";
  }
  const std::string dir = scratch_dir("shard_http");
  std::vector<std::string> files, urls;
  std::vector<ShardIndexEntry> index;
  for (int s = 0; s < 3; ++s) {
    const std::string name = "train-" + std::to_string(s) + ".tar";
    TarWriter w(dir + "/" + name);
    for (int i = 0; i < 8; ++i) {
      const std::string key = std::to_string(s) + "-" + std::to_string(i);
      w.add(key + ".png", encode_png(at::full({3, 3}, s * 8 + i, at::kByte)));
      w.add(key + ".cls", std::to_string(i));
    }
    w.close();
    index.push_back({name, 8, w.bytes()});
    files.push_back(dir + "/" + name);
  }
  write_shard_index(dir, index);
  HttpServer server(dir);
  ASSERT_GT(server.port(), 0) << "the HTTP server did not start";
  const std::string root = "http://127.0.0.1:" + std::to_string(server.port()) + "/";
  for (int s = 0; s < 3; ++s) urls.push_back(root + "train-" + std::to_string(s) + ".tar");

  ShardLoaderOptions o;
  o.streams = 3;
  o.global_batch = 4;
  o.workers = 2;
  o.spec.channels = 1;
  o.spec.label = true;
  o.spec.num_classes = 10;
  o.warn = [](const std::string&) {};
  o.shards = files;
  o.shard_samples = shard_sample_counts(files, "", 1);
  ShardLoader from_files(o);
  o.shards = urls;
  o.shard_samples = shard_sample_counts(urls, root + "index.json", 1);  // the index over HTTP too
  EXPECT_EQ(o.shard_samples, (std::vector<int64_t>{8, 8, 8}));
  ShardLoader from_http(o);
  for (int b = 0; b < 6; ++b) {
    Batch x = from_files.next(), y = from_http.next();
    ASSERT_EQ(x.keys, y.keys) << b;
    ASSERT_TRUE(at::equal(x.images, y.images)) << b;
  }
  // Counting an unindexed shard over HTTP reads it through.
  EXPECT_EQ(shard_sample_counts({urls[1]}, "", 1), (std::vector<int64_t>{8}));

  // 404: final at once, naming the URL.
  FetchOptions quick;
  quick.retries = 3;
  quick.backoff_s = 0.01;
  const std::string missing = data_error_message([&] { open_shard(root + "nope.tar", quick); });
  EXPECT_NE(missing.find("nope.tar: HTTP 404 (after 1 attempt)"), std::string::npos) << missing;
}

TEST(ShardHttp, ARefusedConnectionIsRetriedThenNamed) {
  REQUIRE_CURL();
  // Port 9 (discard): nothing listens there on a test machine, so every attempt is refused.
  FetchOptions quick;
  quick.retries = 2;
  quick.backoff_s = 0.01;
  quick.connect_timeout_s = 2;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string message = data_error_message([&] { open_shard("http://127.0.0.1:9/x.tar", quick); });
  EXPECT_NE(message.find("http://127.0.0.1:9/x.tar"), std::string::npos) << message;
  EXPECT_NE(message.find("(after 3 attempts)"), std::string::npos) << message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}
