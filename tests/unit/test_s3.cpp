// Object-store names, credentials and endpoints (data/shards/s3.h), with the environment given by
// the test: what each variable chooses, and that no message carries a secret.
#include "data/data_error.h"
#include "data/shards/s3.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

using namespace flowtrain::data;

namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(S3, ObjectUrlsNameABucketAndAKey) {
  const S3Object o = parse_object_url("s3://my-bucket/train/shard-000001.tar");
  EXPECT_EQ(o.bucket, "my-bucket");
  EXPECT_EQ(o.key, "train/shard-000001.tar");
  EXPECT_FALSE(o.gcs);
  EXPECT_TRUE(parse_object_url("gs://b/k").gcs);
  EXPECT_TRUE(is_object_store_url("s3://b/k"));
  EXPECT_FALSE(is_object_store_url("https://b/k"));
  for (const char* bad : {"s3://bucket-only", "s3:///key", "s3://bucket/", "http://x/y"})
    EXPECT_NE(error_of([&] { parse_object_url(bad); }).find(bad), std::string::npos) << bad;
}

TEST(S3, CredentialsComeFromTheEnvironmentFirstThenTheProfileOfTheSharedFile) {
  const S3Credentials from_env = resolve_credentials(
      env_of({{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "s3cr3t"}, {"AWS_SESSION_TOKEN", "tok"}}));
  EXPECT_EQ(from_env.access_key, "AKID");
  EXPECT_EQ(from_env.secret_key, "s3cr3t");
  EXPECT_EQ(from_env.session_token, "tok");

  const std::string file = flowtrain::test::scratch_dir("s3_credentials") + "/credentials";
  std::ofstream(file) << "[default]\naws_access_key_id = DEFAULTID\naws_secret_access_key = defaultsecret\n\n"
                         "# a comment\n[training]\naws_access_key_id=TRAINID\naws_secret_access_key=trainsecret\n"
                         "aws_session_token = traintoken\n";
  const S3Credentials by_default = resolve_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}}));
  EXPECT_EQ(by_default.access_key, "DEFAULTID");
  EXPECT_EQ(by_default.secret_key, "defaultsecret");
  EXPECT_EQ(by_default.source, file + " [default]");
  const S3Credentials profile =
      resolve_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "training"}}));
  EXPECT_EQ(profile.access_key, "TRAINID");
  EXPECT_EQ(profile.session_token, "traintoken");

  // Missing or half-set credentials: one error that says where it looked, and no secret.
  const std::string missing =
      error_of([&] { resolve_credentials(env_of({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "nope"}})); });
  EXPECT_NE(missing.find(file), std::string::npos) << missing;
  EXPECT_NE(missing.find("[nope]"), std::string::npos) << missing;
  for (const char* secret : {"defaultsecret", "trainsecret", "traintoken"})
    EXPECT_EQ(missing.find(secret), std::string::npos) << missing;
  const std::string half = error_of([&] { resolve_credentials(env_of({{"AWS_SECRET_ACCESS_KEY", "hunter2"}})); });
  EXPECT_NE(half.find("AWS_ACCESS_KEY_ID"), std::string::npos) << half;
  EXPECT_EQ(half.find("hunter2"), std::string::npos) << half;
}

TEST(S3, EndpointsAreAwsVirtualHostedOrACustomPathStyleStore) {
  const S3Object o = parse_object_url("s3://data/a dir/x+y.tar");
  const S3Endpoint aws = resolve_endpoint(o, env_of({{"AWS_REGION", "eu-west-1"}}));
  EXPECT_EQ(object_http_url(o, aws), "https://data.s3.eu-west-1.amazonaws.com/a%20dir/x%2By.tar");
  EXPECT_EQ(resolve_endpoint(o, env_of({})).region, "us-east-1");
  EXPECT_EQ(resolve_endpoint(o, env_of({{"AWS_DEFAULT_REGION", "ap-south-1"}})).region, "ap-south-1");
  const S3Endpoint minio = resolve_endpoint(o, env_of({{"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}}));
  EXPECT_EQ(object_http_url(o, minio), "http://127.0.0.1:9000/data/a%20dir/x%2By.tar");
  // The S3-specific variable wins over the general one, as in the AWS tools.
  const S3Endpoint specific = resolve_endpoint(
      o, env_of({{"AWS_ENDPOINT_URL", "http://a:1"}, {"AWS_ENDPOINT_URL_S3", "https://b.example.com"}}));
  EXPECT_EQ(specific.base, "https://b.example.com");
  const S3Object g = parse_object_url("gs://bucket/k.tar");
  EXPECT_EQ(object_http_url(g, resolve_endpoint(g, env_of({}))), "https://storage.googleapis.com/bucket/k.tar");
  EXPECT_NE(error_of([&] { resolve_endpoint(o, env_of({{"AWS_ENDPOINT_URL", "127.0.0.1:9000"}})); }).find("127.0.0.1:9000"),
            std::string::npos);

  const HttpAuth auth = sigv4_auth(S3Credentials{"AKID", "sk", "tok", "env"}, aws);
  EXPECT_EQ(auth.aws_sigv4, "aws:amz:eu-west-1:s3");
  EXPECT_EQ(auth.user_password, "AKID:sk");
  EXPECT_EQ(auth.headers, (std::vector<std::string>{"x-amz-content-sha256: UNSIGNED-PAYLOAD",
                                                    "x-amz-security-token: tok"}));
}
