#include "data/shards/s3.h"

#include "data/data_error.h"

#include <fmt/format.h>

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
  std::string key;
  for (const unsigned char ch : object.key) {
    const bool unreserved = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                            ch == '-' || ch == '_' || ch == '.' || ch == '~' || ch == '/';
    key += unreserved ? std::string(1, static_cast<char>(ch)) : fmt::format("%{:02X}", ch);
  }
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

}  // namespace flowtrain::data
