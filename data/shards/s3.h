// Objects in S3 and S3-compatible stores (MinIO, Ceph RGW, R2, CoreWeave; Google Cloud Storage
// through its XML API with HMAC keys), named as the AWS tools name them:
//   s3://bucket/key/of/the/object.tar      gs://bucket/key (= the GCS endpoint, path-style)
// read over HTTPS with AWS Signature Version 4 (libcurl's signer). Where the parts come from:
//   credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the shared
//                credentials file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials),
//                profile AWS_PROFILE (default "default")
//   region       AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1 (GCS: "auto")
//   endpoint     AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (an S3-compatible store: path-style
//                http(s)://host[:port]/bucket/key), else AWS's virtual-hosted
//                https://bucket.s3.region.amazonaws.com/key
// A secret never appears in a message, a log line or a URL: errors name the s3:// entry, the
// endpoint and where the credentials came from (the variable or the file and profile).
#pragma once

#include "data/shards/byte_stream.h"
#include "data/shards/http_stream.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace flowtrain::data {

struct S3Object {
  std::string bucket, key;
  bool gcs = false;  // named gs://
};

// Throws DataError naming `url` when it is not s3://BUCKET/KEY or gs://BUCKET/KEY.
S3Object parse_object_url(const std::string& url);
bool is_object_store_url(const std::string& url);  // s3:// or gs://

// The environment, as a function so tests can give their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

struct S3Credentials {
  std::string access_key, secret_key, session_token;
  std::string source;  // where they came from, for messages: "AWS_ACCESS_KEY_ID/…" or "FILE [profile]"
};
// Throws DataError naming what was looked at (never a value) when no complete pair is found.
S3Credentials resolve_credentials(const EnvLookup& env);

struct S3Endpoint {
  std::string base;      // scheme://host[:port], no trailing slash
  bool path_style = false;
  std::string region;
};
S3Endpoint resolve_endpoint(const S3Object& object, const EnvLookup& env);

// The object's HTTP(S) URL at `endpoint`, its key percent-encoded as SigV4 signs it (every byte
// but A–Z a–z 0–9 - _ . ~ and the key's '/' separators).
std::string object_http_url(const S3Object& object, const S3Endpoint& endpoint);

// How an S3 request is signed (http_stream.h HttpAuth).
HttpAuth sigv4_auth(const S3Credentials& credentials, const S3Endpoint& endpoint);

// Opens one object for streaming (an entry of data.shards), signed; the stream's name is `url`.
std::unique_ptr<ByteStream> open_object(const std::string& url, const FetchOptions& options, const EnvLookup& env);

// Every key under `prefix` in `bucket`, in S3's order (UTF-8 binary), through ListObjectsV2 pages
// of `page_size` keys (continuation tokens: a million keys are a thousand requests).
std::vector<std::string> list_objects(const std::string& bucket, const std::string& prefix, bool gcs,
                                      const FetchOptions& options, const EnvLookup& env, int64_t page_size = 1000);

// True when an object URL holds a wildcard (* ? [) in its key.
bool has_wildcard(const std::string& url);
// s3://bucket/dir/train-*.tar -> the matching objects' URLs, sorted: the key's part before the
// first wildcard is the listing's prefix, the rest matches as a shell glob whose * and ? do not
// cross '/'. Throws DataError naming the pattern when nothing matches.
std::vector<std::string> expand_object_glob(const std::string& pattern, const FetchOptions& options,
                                            const EnvLookup& env, int64_t page_size = 1000);

}  // namespace flowtrain::data
