#include "data/shards/http_stream.h"

#include "data/data_error.h"

#include <fmt/format.h>

#ifdef FLOWTRAIN_HAVE_CURL
#include <curl/curl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#endif

namespace flowtrain::data {
#ifdef FLOWTRAIN_HAVE_CURL
namespace {

constexpr size_t kMaxBuffered = 8u << 20;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw DataError("libcurl: curl_global_init failed");
  });
}

// Errors worth another attempt: the network or the server, not the request.
bool transient(CURLcode code, long http_status) {
  if (code == CURLE_HTTP_RETURNED_ERROR) return http_status >= 500 || http_status == 408 || http_status == 429;
  switch (code) {
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

class HttpStream final : public ByteStream {
 public:
  HttpStream(const std::string& name, const std::string& url, const FetchOptions& options, HttpAuth auth,
             std::string denied_hint)
      : ByteStream(name), url_(url), options_(options), auth_(std::move(auth)), denied_hint_(std::move(denied_hint)) {
    init_curl_once();
    for (const auto& h : auth_.headers) headers_ = curl_slist_append(headers_, h.c_str());
    multi_ = curl_multi_init();
    if (!multi_) throw DataError(fmt::format("shard {}: curl_multi_init failed", url));
    try {
      start_transfer();
      // Fail here, not at the first read, when the URL cannot be reached at all: wait for the
      // first byte or the end.
      while (pending() == 0 && !done_) pump();
    } catch (...) {
      stop_transfer();
      curl_multi_cleanup(multi_);
      curl_slist_free_all(headers_);
      throw;
    }
  }

  ~HttpStream() override {
    stop_transfer();
    curl_multi_cleanup(multi_);
    curl_slist_free_all(headers_);
  }

  size_t read(char* dst, size_t n) override {
    while (pending() == 0 && !done_) pump();
    const size_t take = std::min(n, pending());
    std::memcpy(dst, buffer_.data() + consumed_, take);
    consumed_ += take;
    if (consumed_ == buffer_.size()) {
      buffer_.clear();
      consumed_ = 0;
    }
    return take;
  }

 private:
  size_t pending() const { return buffer_.size() - consumed_; }

  void start_transfer() {
    easy_ = curl_easy_init();
    if (!easy_) throw DataError(fmt::format("shard {}: curl_easy_init failed", name()));
    curl_easy_setopt(easy_, CURLOPT_URL, url_.c_str());
    if (!auth_.empty()) {  // SigV4: libcurl signs each request (a retry's too, with its own date)
      curl_easy_setopt(easy_, CURLOPT_AWS_SIGV4, auth_.aws_sigv4.c_str());
      curl_easy_setopt(easy_, CURLOPT_USERPWD, auth_.user_password.c_str());
    }
    if (headers_) curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &HttpStream::on_data);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
    curl_easy_setopt(easy_, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy_, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(easy_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_s * 1000));
    curl_easy_setopt(easy_, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(easy_, CURLOPT_LOW_SPEED_TIME, static_cast<long>(std::max(1.0, options_.stall_timeout_s)));
    curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, error_text_);
    error_text_[0] = '\0';
    range_requested_ = received_ > 0;
    received_at_start_ = received_;
    status_checked_ = false;
    to_drop_ = 0;
    if (range_requested_) curl_easy_setopt(easy_, CURLOPT_RANGE, fmt::format("{}-", received_).c_str());
    curl_multi_add_handle(multi_, easy_);
    paused_ = false;
  }

  void stop_transfer() {
    if (!easy_) return;
    curl_multi_remove_handle(multi_, easy_);
    curl_easy_cleanup(easy_);
    easy_ = nullptr;
  }

  static size_t on_data(char* data, size_t size, size_t nmemb, void* self_ptr) {
    auto* self = static_cast<HttpStream*>(self_ptr);
    size_t n = size * nmemb;
    if (!self->status_checked_) {
      long status = 0;
      curl_easy_getinfo(self->easy_, CURLINFO_RESPONSE_CODE, &status);
      // A server that ignores Range sends the whole body again: drop what we already have.
      if (self->range_requested_ && status == 200) self->to_drop_ = self->received_;
      self->status_checked_ = true;
    }
    if (self->pending() >= kMaxBuffered) {
      self->paused_ = true;
      return CURL_WRITEFUNC_PAUSE;  // libcurl delivers this chunk again after unpausing
    }
    const size_t dropped = static_cast<size_t>(std::min<uint64_t>(self->to_drop_, n));
    self->to_drop_ -= dropped;
    self->buffer_.append(data + dropped, n - dropped);
    self->received_ += n - dropped;
    return n;
  }

  void pump() {
    if (options_.cancelled()) throw DataError(fmt::format("shard {}: cancelled", name()));
    if (paused_ && pending() < kMaxBuffered) {
      paused_ = false;
      curl_easy_pause(easy_, CURLPAUSE_CONT);
    }
    int running = 0;
    curl_multi_perform(multi_, &running);
    if (running > 0) curl_multi_poll(multi_, nullptr, 0, 200, nullptr);
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      finish_attempt(msg->data.result);
      return;
    }
  }

  void finish_attempt(CURLcode code) {
    long status = 0;
    curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &status);
    // A resume asked for bytes past the end: the body was complete.
    if (code == CURLE_OK || (code == CURLE_HTTP_RETURNED_ERROR && status == 416 && range_requested_)) {
      done_ = true;
      return;
    }
    // The retry budget is for consecutive failures: an attempt that moved data (then broke, e.g.
    // a server closing a connection paused while the trainer was busy) starts it afresh.
    if (received_ > received_at_start_) attempts_ = 0;
    const std::string why =
        code == CURLE_HTTP_RETURNED_ERROR
            ? fmt::format("HTTP {}{}", status,
                          (status == 401 || status == 403) && !denied_hint_.empty() ? " (" + denied_hint_ + ")" : "")
                                          : fmt::format("{}{}{}", curl_easy_strerror(code), error_text_[0] ? ": " : "",
                                                        error_text_);
    stop_transfer();
    if (!transient(code, status) || attempts_ >= options_.retries)
      throw DataError(fmt::format("shard {}: {} (after {} attempt{})", name(), why, attempts_ + 1,
                                  attempts_ == 0 ? "" : "s"));
    // Exponential backoff with "equal jitter" (half fixed, half uniform): ranks and workers that
    // were throttled together (S3's 503 SlowDown) do not come back together.
    const double ceiling = options_.backoff_s * static_cast<double>(1u << std::min(attempts_, 16));
    const double wait = ceiling * (0.5 + 0.5 * std::uniform_real_distribution<double>(0.0, 1.0)(jitter_));
    ++attempts_;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
    while (std::chrono::steady_clock::now() < until) {  // in slices: a shutdown does not wait it out
      if (options_.cancelled()) throw DataError(fmt::format("shard {}: cancelled", name()));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    start_transfer();
  }

  std::string url_;  // what is requested (name() is what messages say)
  FetchOptions options_;
  HttpAuth auth_;
  std::string denied_hint_;
  curl_slist* headers_ = nullptr;
  CURLM* multi_ = nullptr;
  CURL* easy_ = nullptr;
  char error_text_[CURL_ERROR_SIZE] = {};
  std::string buffer_;
  size_t consumed_ = 0;
  uint64_t received_ = 0;  // body bytes accepted so far: where a resumed transfer starts
  uint64_t to_drop_ = 0;
  uint64_t received_at_start_ = 0;  // received_ when the current attempt started
  bool range_requested_ = false, status_checked_ = false, paused_ = false, done_ = false;
  int attempts_ = 0;
  std::minstd_rand jitter_{std::random_device{}()};
};

}  // namespace

std::unique_ptr<ByteStream> open_http_stream(const std::string& url, const FetchOptions& options) {
  return std::make_unique<HttpStream>(url, url, options, HttpAuth{}, "");
}

std::unique_ptr<ByteStream> open_http_stream(const std::string& name, const std::string& url,
                                             const FetchOptions& options, const HttpAuth& auth,
                                             const std::string& denied_hint) {
  return std::make_unique<HttpStream>(name, url, options, auth, denied_hint);
}
#else
std::unique_ptr<ByteStream> open_http_stream(const std::string& url, const FetchOptions&) {
  throw DataError(fmt::format("shard {}: this flowtrain was built without libcurl (install libcurl4-openssl-dev and "
                              "rebuild), so http(s) shards cannot be read; pipe:curl -s URL works meanwhile",
                              url));
}

std::unique_ptr<ByteStream> open_http_stream(const std::string& name, const std::string&, const FetchOptions&,
                                             const HttpAuth&, const std::string&) {
  throw DataError(fmt::format("shard {}: this flowtrain was built without libcurl (install libcurl4-openssl-dev and "
                              "rebuild), so object-store shards cannot be read",
                              name));
}
#endif

}  // namespace flowtrain::data
