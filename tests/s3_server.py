#!/usr/bin/env python3
"""A real S3 server on loopback for the object-store tests: moto's server (moto[server] from PyPI,
installed by scripts/setup.sh into $FLOWTRAIN_DEPS/moto-venv) with authentication enforced, so a
request signed with a wrong secret is refused as AWS refuses it (403 SignatureDoesNotMatch).

  s3_server.py --bucket NAME [--upload LOCAL_FILE=KEY …]

creates an IAM user allowed s3:* and its access key (the only unauthenticated requests), the
bucket and the objects (signed with that key), prints one JSON line
{"endpoint": "http://127.0.0.1:PORT", "access_key": …, "secret_key": …} and serves until its
standard input closes.
"""
import argparse
import json
import os
import sys

# Every request after the first four (the IAM setup below) must carry a valid signature.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--upload", action="append", default=[], help="LOCAL_FILE=KEY")
    args = parser.parse_args()

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    setup = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup", aws_secret_access_key="setup")
    iam = boto3.client("iam", **setup)
    iam.create_user(UserName="flowtrain")
    arn = iam.create_policy(PolicyName="s3-all", PolicyDocument=json.dumps(POLICY))["Policy"]["Arn"]
    iam.attach_user_policy(UserName="flowtrain", PolicyArn=arn)
    key = iam.create_access_key(UserName="flowtrain")["AccessKey"]

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket=args.bucket)
    for item in args.upload:
        local, _, name = item.partition("=")
        s3.upload_file(local, args.bucket, name)

    print(json.dumps({"endpoint": endpoint, "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}),
          flush=True)
    sys.stdin.read()  # until the test closes our standard input
    server.stop()


if __name__ == "__main__":
    main()
