// Shards over HTTP(S) through libcurl, streamed with bounded memory (the transfer pauses while
// 8 MiB are waiting to be read). Connection errors, timeouts, stalls and 5xx answers are retried
// with jittered exponential backoff; a transfer that breaks after some bytes resumes with
// `Range: bytes=N-` (a server that ignores the range answers 200 and the first N bytes are
// dropped). After the last retry: a DataError naming the URL, the attempts and the last error.
#pragma once

#include "data/shards/byte_stream.h"

#include <memory>
#include <string>
#include <vector>

namespace flowtrain::data {

// How libcurl signs a request (CURLOPT_AWS_SIGV4, CURLOPT_USERPWD) and the headers it adds.
struct HttpAuth {
  std::string aws_sigv4;      // "aws:amz:REGION:s3"; empty: no signing
  std::string user_password;  // "ACCESS_KEY:SECRET_KEY"
  std::vector<std::string> headers;  // S3's x-amz-content-sha256, x-amz-security-token
  bool empty() const { return aws_sigv4.empty(); }
};


std::unique_ptr<ByteStream> open_http_stream(const std::string& url, const FetchOptions& options);
// A signed request (an s3:// object): `name` is what messages call it (the s3:// entry; never the
// signed request), `denied_hint` what a 401/403 answer adds (where the credentials came from).
std::unique_ptr<ByteStream> open_http_stream(const std::string& name, const std::string& url,
                                             const FetchOptions& options, const HttpAuth& auth,
                                             const std::string& denied_hint);

}  // namespace flowtrain::data
