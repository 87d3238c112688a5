// Shards over HTTP(S) through libcurl, streamed with bounded memory (the transfer pauses while
// 8 MiB are waiting to be read). Connection errors, timeouts, stalls and 5xx answers are retried
// with exponential backoff; a transfer that breaks after some bytes resumes with
// `Range: bytes=N-` (a server that ignores the range answers 200 and the first N bytes are
// dropped). After the last retry: a DataError naming the URL, the attempts and the last error.
#pragma once

#include "data/shards/byte_stream.h"

#include <memory>
#include <string>

namespace flowtrain::data {

std::unique_ptr<ByteStream> open_http_stream(const std::string& url, const FetchOptions& options);

}  // namespace flowtrain::data
