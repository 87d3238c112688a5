#!/usr/bin/env python3
"""A real S3 server on loopback for the object-store tests: moto's server (moto[server] from PyPI,
installed by scripts/setup.sh into $FLOWTRAIN_DEPS/moto-venv) with authentication enforced, so a
request signed with a wrong secret is refused as AWS refuses it (403 SignatureDoesNotMatch).

  s3_server.py --bucket NAME [--upload LOCAL_FILE=KEY …] [--faults]

creates an IAM user allowed s3:* and its access key (the only unauthenticated requests), the
bucket and the objects (signed with that key), prints one JSON line
{"endpoint": "http://127.0.0.1:PORT", "access_key": …, "secret_key": …} and serves until its
standard input closes.

--faults puts a proxy in front of the server (the endpoint printed is the proxy's; requests pass
through unchanged, Host header included, so signatures still check): the first GET of every
object is answered 503 SlowDown as S3 throttles, and the second full GET of every key containing
"-000001." is cut after half its body (the client must resume with a Range request).
"""
import argparse
import http.client
import http.server
import json
import os
import sys
import threading

# Every request after the first four (the IAM setup below) must carry a valid signature.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message></Error>')


def start_fault_proxy(upstream_port):
    gets = {}
    lock = threading.Lock()

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            path = self.path.split("?")[0]
            is_object = "?" not in self.path
            with lock:
                n = gets[path] = gets.get(path, 0) + 1
            if is_object and n == 1:  # throttled, as S3 answers a hot prefix
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(SLOW_DOWN)
                return
            upstream = http.client.HTTPConnection("127.0.0.1", upstream_port)
            upstream.request("GET", self.path, headers=dict(self.headers.items()))
            answer = upstream.getresponse()
            body = answer.read()
            cut = is_object and n == 2 and "-000001." in path and "Range" not in self.headers
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if cut else body)
            if cut:  # the connection drops mid-body
                self.wfile.flush()
                self.close_connection = True
            upstream.close()

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--upload", action="append", default=[], help="LOCAL_FILE=KEY")
    parser.add_argument("--faults", action="store_true", help="throttle and cut through a proxy (above)")
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

    if args.faults:
        proxy = start_fault_proxy(port)
        endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
    print(json.dumps({"endpoint": endpoint, "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}),
          flush=True)
    sys.stdin.read()  # until the test closes our standard input
    server.stop()


if __name__ == "__main__":
    main()
