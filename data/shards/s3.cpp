#include "data/shards/s3.h"

#include "data/data_error.h"
#include "data/shards/http_stream.h"

#include <fmt/format.h>

#include <fnmatch.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>

namespace flowtrain::data {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// One profile's keys of an AWS shared credentials file (INI: "[name]" sections of "key = value").
std::map<std::string, std::string> read_profile(const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  std::map<std::string, std::string> keys;
  std::string line, section;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (section == profile && eq != std::string::npos) keys[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return keys;
}

// SigV4's URI encoding: every byte but the unreserved ones (and '/' where `keep_slash`).
std::string uri_encode(const std::string& s, bool keep_slash) {
  std::string out;
  for (const unsigned char ch : s) {
    const bool unreserved = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                            ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/');
    out += unreserved ? std::string(1, static_cast<char>(ch)) : fmt::format("%{:02X}", ch);
  }
  return out;
}

std::string xml_unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t end = s.find(';', i);
    const std::string entity = end == std::string::npos ? "" : s.substr(i + 1, end - i - 1);
    if (entity == "amp") out += '&';
    else if (entity == "lt") out += '<';
    else if (entity == "gt") out += '>';
    else if (entity == "quot") out += '"';
    else if (entity == "apos") out += '\'';
    else if (!entity.empty() && entity[0] == '#')
      out += static_cast<char>(std::stol(entity.substr(1, 1) == "x" ? entity.substr(2) : entity.substr(1), nullptr,
                                         entity.substr(1, 1) == "x" ? 16 : 10));
    else {
      out += '&';
      continue;
    }
    i = end;
  }
  return out;
}

// The text of every <tag>…</tag> in `xml`, in order.
std::vector<std::string> xml_values(const std::string& xml, const std::string& tag) {
  std::vector<std::string> values;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  for (size_t at = xml.find(open); at != std::string::npos; at = xml.find(open, at)) {
    const size_t begin = at + open.size(), end = xml.find(close, begin);
    if (end == std::string::npos) break;
    values.push_back(xml_unescape(xml.substr(begin, end - begin)));
    at = end + close.size();
  }
  return values;
}

std::string read_all(ByteStream& stream) {
  std::string body;
  char buf[65536];
  while (const size_t n = stream.read(buf, sizeof buf)) body.append(buf, n);
  return body;
}

}  // namespace

bool is_object_store_url(const std::string& url) { return starts_with(url, "s3://") || starts_with(url, "gs://"); }

S3Object parse_object_url(const std::string& url) {
  if (!is_object_store_url(url)) throw DataError(fmt::format("'{}' is not an s3:// or gs:// URL", url));
  const std::string rest = url.substr(5);
  const auto slash = rest.find('/');
  S3Object o;
  o.gcs = starts_with(url, "gs://");
  o.bucket = rest.substr(0, slash);
  o.key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (o.bucket.empty() || o.key.empty())
    throw DataError(fmt::format("'{}': an object URL is {}://BUCKET/KEY", url, o.gcs ? "gs" : "s3"));
  return o;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
}

S3Credentials resolve_credentials(const EnvLookup& env) {
  S3Credentials c;
  const auto id = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (id && secret) {
    c.access_key = *id;
    c.secret_key = *secret;
    c.session_token = env("AWS_SESSION_TOKEN").value_or("");
    c.source = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY";
    return c;
  }
  if (id || secret)
    throw DataError(fmt::format("object store credentials: {} is set but {} is not", id ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                                id ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID"));
  std::string file;
  if (const auto f = env("AWS_SHARED_CREDENTIALS_FILE")) {
    file = *f;
  } else if (const auto home = env("HOME")) {
    file = *home + "/.aws/credentials";
  }
  const std::string profile = env("AWS_PROFILE").value_or("default");
  const auto keys = file.empty() ? std::map<std::string, std::string>{} : read_profile(file, profile);
  const auto key_id = keys.find("aws_access_key_id"), key_secret = keys.find("aws_secret_access_key");
  if (key_id == keys.end() || key_secret == keys.end())
    throw DataError(fmt::format("object store credentials: none found (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are "
                                "not set, and {} has no profile [{}] with aws_access_key_id and aws_secret_access_key)",
                                file.empty() ? std::string("no shared credentials file (HOME is not set)") : file,
                                profile));
  c.access_key = key_id->second;
  c.secret_key = key_secret->second;
  if (const auto token = keys.find("aws_session_token"); token != keys.end()) c.session_token = token->second;
  c.source = fmt::format("{} [{}]", file, profile);
  return c;
}

S3Endpoint resolve_endpoint(const S3Object& object, const EnvLookup& env) {
  S3Endpoint e;
  if (object.gcs) {  // Cloud Storage's XML API speaks S3's protocol with HMAC keys
    e.base = "https://storage.googleapis.com";
    e.path_style = true;
    e.region = "auto";
    return e;
  }
  e.region = env("AWS_REGION").value_or(env("AWS_DEFAULT_REGION").value_or("us-east-1"));
  auto custom = env("AWS_ENDPOINT_URL_S3");
  if (!custom) custom = env("AWS_ENDPOINT_URL");
  if (custom) {
    e.base = *custom;
    while (!e.base.empty() && e.base.back() == '/') e.base.pop_back();
    if (!starts_with(e.base, "http://") && !starts_with(e.base, "https://"))
      throw DataError(fmt::format("AWS_ENDPOINT_URL '{}': expected http(s)://host[:port]", e.base));
    e.path_style = true;  // what MinIO, Ceph and local servers answer; no per-bucket DNS needed
    return e;
  }
  e.base = fmt::format("https://{}.s3.{}.amazonaws.com", object.bucket, e.region);
  return e;
}

std::string object_http_url(const S3Object& object, const S3Endpoint& endpoint) {
  const std::string key = uri_encode(object.key, /*keep_slash=*/true);
  return endpoint.path_style ? fmt::format("{}/{}/{}", endpoint.base, object.bucket, key)
                             : fmt::format("{}/{}", endpoint.base, key);
}

HttpAuth sigv4_auth(const S3Credentials& credentials, const S3Endpoint& endpoint) {
  HttpAuth a;
  a.aws_sigv4 = fmt::format("aws:amz:{}:s3", endpoint.region);
  a.user_password = credentials.access_key + ":" + credentials.secret_key;
  // S3 wants the payload's hash signed; a GET has none worth hashing.
  a.headers.push_back("x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!credentials.session_token.empty()) a.headers.push_back("x-amz-security-token: " + credentials.session_token);
  return a;
}

namespace {
std::string denied_hint(const S3Endpoint& endpoint, const S3Credentials& credentials) {
  return fmt::format("access denied at {} with the credentials of {}", endpoint.base, credentials.source);
}
}  // namespace

std::unique_ptr<ByteStream> open_object(const std::string& url, const FetchOptions& options, const EnvLookup& env) {
  const S3Object object = parse_object_url(url);
  const S3Credentials credentials = resolve_credentials(env);
  const S3Endpoint endpoint = resolve_endpoint(object, env);
  return open_http_stream(url, object_http_url(object, endpoint), options, sigv4_auth(credentials, endpoint),
                          denied_hint(endpoint, credentials));
}

std::vector<std::string> list_objects(const std::string& bucket, const std::string& prefix, bool gcs,
                                      const FetchOptions& options, const EnvLookup& env, int64_t page_size) {
  const S3Object where{bucket, prefix, gcs};
  const S3Credentials credentials = resolve_credentials(env);
  const S3Endpoint endpoint = resolve_endpoint(where, env);
  const std::string name = fmt::format("{}://{}/{}", gcs ? "gs" : "s3", bucket, prefix);
  const std::string bucket_url = endpoint.path_style ? fmt::format("{}/{}", endpoint.base, bucket) : endpoint.base;
  std::vector<std::string> keys;
  std::string token;
  for (int64_t page = 0;; ++page) {
    // The parameters in SigV4's canonical order (sorted by name), each value URI-encoded.
    std::string query = token.empty() ? "" : "continuation-token=" + uri_encode(token, false) + "&";
    query += fmt::format("list-type=2&max-keys={}&prefix={}", page_size, uri_encode(prefix, false));
    const auto stream = open_http_stream(fmt::format("{} (listing, page {})", name, page + 1),
                                         bucket_url + "/?" + query, options, sigv4_auth(credentials, endpoint),
                                         denied_hint(endpoint, credentials));
    const std::string body = read_all(*stream);
    for (auto& key : xml_values(body, "Key")) keys.push_back(std::move(key));
    const auto truncated = xml_values(body, "IsTruncated");
    const auto next = xml_values(body, "NextContinuationToken");
    if (truncated.empty() || truncated.front() != "true") break;
    if (next.empty() || next.front().empty())
      throw DataError(fmt::format("{}: the listing says it is truncated but gives no continuation token", name));
    token = next.front();
  }
  return keys;
}

bool has_wildcard(const std::string& url) {
  return is_object_store_url(url) && url.find_first_of("*?[", 5) != std::string::npos;
}

std::vector<std::string> expand_object_glob(const std::string& pattern, const FetchOptions& options,
                                            const EnvLookup& env, int64_t page_size) {
  const S3Object object = parse_object_url(pattern);
  const std::string prefix = object.key.substr(0, object.key.find_first_of("*?["));
  std::vector<std::string> keys = list_objects(object.bucket, prefix, object.gcs, options, env, page_size);
  std::vector<std::string> matched;
  for (const auto& key : keys)
    if (fnmatch(object.key.c_str(), key.c_str(), FNM_PATHNAME) == 0)
      matched.push_back(fmt::format("{}://{}/{}", object.gcs ? "gs" : "s3", object.bucket, key));
  std::sort(matched.begin(), matched.end());
  if (matched.empty())
    throw DataError(fmt::format("data.shards: {} matches no object ({} key{} under the prefix '{}')", pattern,
                                keys.size(), keys.size() == 1 ? "" : "s", prefix));
  return matched;
}

}  // namespace flowtrain::data
