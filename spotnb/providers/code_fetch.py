"""Fetch a job's spotnb wheel from its store and check it, on a VM that has no spotnb yet.

The boot script (spotnb.providers.bootstrap) runs this file's text with the image's Python, so
it uses the standard library only and imports nothing of spotnb: `python - DEST` with, in the
environment, SPOTNB_WHEEL_URL (the wheel's URL in the store), SPOTNB_WHEEL_SHA256 and
SPOTNB_WHEEL_SIZE (written into the boot script by the launcher, which read them from the job's
signed `code.json`). Exit 0: DEST holds exactly those bytes. Exit 1: nothing was written, and
one line on stderr says why (a refusal names the digests, never a token).

The object is read with the VM's own identity, as the agent reads the store later: an s3://
store with the instance profile's credentials from IMDSv2 (or AWS_* in the environment) and a
SigV4-signed GET; gs:// with the service account's token from the metadata server; az:// with
the managed identity's token from IMDS; a path or file:// from the disk (the tests). A custom
endpoint (AWS_ENDPOINT_URL[_S3], STORAGE_EMULATOR_HOST, the BlobEndpoint and AccountKey of
AZURE_STORAGE_CONNECTION_STRING: Azurite) is honoured as the SDKs honour it.

Notes are comments, not docstrings: the boot script carries this text without its comments
(EC2's user data holds 16 KB), and without annotations it runs on any Python 3 of an image.
"""

import base64
import datetime
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 30
IMDS = os.environ.get("SPOTNB_IMDS_URL", "http://169.254.169.254")
GCE = os.environ.get("SPOTNB_GCE_METADATA_URL", "http://metadata.google.internal")


class Refused(Exception):
    # The bytes are not the job's wheel: never retried, never installed.
    pass


def _read(url, headers=None, method="GET", limit=None):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        return resp.read() if limit is None else resp.read(limit)


def aws_credentials(env):
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN", "")
    token = _read(IMDS + "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT")
    auth = {"X-aws-ec2-metadata-token": token.decode()}
    base = IMDS + "/latest/meta-data/iam/security-credentials/"
    role = _read(base, auth).decode().split()[0]
    doc = json.loads(_read(base + role, auth))
    return doc["AccessKeyId"], doc["SecretAccessKey"], doc.get("Token", "")


def bucket_region(bucket):
    # An S3 bucket's region: S3 names it in a header of any answer, even a refusal.
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"https://s3.amazonaws.com/{bucket}", method="HEAD"), timeout=TIMEOUT
        ) as resp:
            return resp.headers.get("x-amz-bucket-region") or "us-east-1"
    except urllib.error.HTTPError as exc:
        return exc.headers.get("x-amz-bucket-region") or "us-east-1"


def s3_request(bucket, key, region, creds, endpoint="", now=None):
    # (url, headers) of a SigV4-signed GET of s3://bucket/key.
    now = now or datetime.datetime.now(datetime.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    path = "/" + urllib.parse.quote(key, safe="/-_.~")
    if endpoint:  # a custom endpoint (MinIO, moto): path style
        split = urllib.parse.urlsplit(endpoint)
        host, path, scheme = split.netloc, f"/{bucket}{path}", split.scheme
    elif "." in bucket:  # a dotted name does not match the wildcard certificate
        host, path, scheme = f"s3.{region}.amazonaws.com", f"/{bucket}{path}", "https"
    else:
        host, scheme = f"{bucket}.s3.{region}.amazonaws.com", "https"
    key_id, secret, token = creds
    headers = {"host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "x-amz-date": stamp}
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    signed = ";".join(names)
    canonical = "\n".join(
        ["GET", path, "", *(f"{n}:{headers[n]}" for n in names), "", signed, "UNSIGNED-PAYLOAD"]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, digest])
    k = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    return f"{scheme}://{host}{path}", headers


def gcs_request(bucket, name, env):
    quoted = urllib.parse.quote(name, safe="")
    emulator = env.get("STORAGE_EMULATOR_HOST")
    if emulator:
        return f"{emulator.rstrip('/')}/storage/v1/b/{bucket}/o/{quoted}?alt=media", {}
    url = GCE + "/computeMetadata/v1/instance/service-accounts/default/token"
    token = json.loads(_read(url, {"Metadata-Flavor": "Google"}))["access_token"]
    return (
        f"https://storage.googleapis.com/storage/v1/b/{bucket}/o/{quoted}?alt=media",
        {"Authorization": "Bearer " + token},
    )


def azure_shared_key(conn, container, blob):
    # (url, headers) of a SharedKey-signed GET from the BlobEndpoint of a connection string (an
    # emulator such as Azurite, which adlfs and the SDKs reach through the same variable).
    c = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
    url = c["BlobEndpoint"].rstrip("/") + f"/{container}/" + urllib.parse.quote(blob, safe="/-_.~")
    h = {"x-ms-date": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime()), "x-ms-version": "2020-04-08"}
    s = "GET" + "\n" * 12 + "".join(f"{k}:{v}\n" for k, v in sorted(h.items()))
    s += "/" + c["AccountName"] + urllib.parse.urlsplit(url).path
    mac = hmac.new(base64.b64decode(c["AccountKey"]), s.encode(), hashlib.sha256).digest()
    h["Authorization"] = f"SharedKey {c['AccountName']}:" + base64.b64encode(mac).decode()
    return url, h


def azure_request(netloc, blob, env):
    container, _, host = netloc.partition("@")  # az://container/... or abfs://container@account.dfs...
    conn = env.get("AZURE_STORAGE_CONNECTION_STRING", "")
    if "BlobEndpoint=" in conn and "AccountKey=" in conn:
        return azure_shared_key(conn, container, blob)
    account = host.split(".")[0] if host else env.get("AZURE_STORAGE_ACCOUNT_NAME", "")
    if not account:
        raise OSError("no storage account (AZURE_STORAGE_ACCOUNT_NAME) to read an az:// store")
    query = {"api-version": "2018-02-01", "resource": "https://storage.azure.com/"}
    if env.get("AZURE_CLIENT_ID"):
        query["client_id"] = env["AZURE_CLIENT_ID"]
    url = IMDS + "/metadata/identity/oauth2/token?" + urllib.parse.urlencode(query)
    token = json.loads(_read(url, {"Metadata": "true"}))["access_token"]
    quoted = urllib.parse.quote(blob, safe="/-_.~")
    return (
        f"https://{account}.blob.core.windows.net/{container}/{quoted}",
        {"Authorization": "Bearer " + token, "x-ms-version": "2020-04-08"},
    )


def read(source, limit, env):
    # At most `limit` bytes of the object at `source` (a store URL or a path).
    split = urllib.parse.urlsplit(source)
    scheme, key = split.scheme.lower(), split.path.lstrip("/")
    if scheme in ("", "file", "local"):
        with open(split.path if scheme else source, "rb") as f:
            return f.read(limit)
    if scheme in ("s3", "s3a"):
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
        if endpoint:
            region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        else:
            region = bucket_region(split.netloc)
        url, headers = s3_request(split.netloc, key, region, aws_credentials(env), endpoint)
    elif scheme in ("gs", "gcs"):
        url, headers = gcs_request(split.netloc, key, env)
    elif scheme in ("az", "abfs", "abfss"):
        url, headers = azure_request(split.netloc, key, env)
    else:
        raise OSError(f"no way to read a {scheme}:// store before spotnb is installed")
    return _read(url, headers, limit=limit)


def check(data, sha256, size):
    # Refused unless `data` is the wheel the boot script names (size, then sha256).
    if len(data) != size:
        have = f"more than {size}" if len(data) > size else str(len(data))
        raise Refused(f"it has {have} bytes, the job's wheel {size} (truncated or replaced)")
    got = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(got, sha256):
        raise Refused(f"its sha256 is {got}, the job's wheel {sha256} (replaced or damaged)")


def main(argv, env):
    dest = argv[1]
    source, sha256, size = env["SPOTNB_WHEEL_URL"], env["SPOTNB_WHEEL_SHA256"], int(env["SPOTNB_WHEEL_SIZE"])
    where = source.split("?", 1)[0]
    for attempt in range(4):
        try:
            data = read(source, size + 1, env)
            check(data, sha256, size)
        except Refused as exc:
            print(f"spotnb code: refused {where}: {exc}; not installing it", file=sys.stderr)
            return 1
        except (OSError, ValueError, KeyError, IndexError) as exc:
            lasting = isinstance(exc, FileNotFoundError) or (
                isinstance(exc, urllib.error.HTTPError)
                and 400 <= exc.code < 500
                and exc.code not in (408, 429)
            )
            if attempt == 3 or lasting:  # a missing object or a refusal does not heal in seconds
                print(f"spotnb code: could not read {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
            time.sleep(2**attempt)
            continue
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        print(f"spotnb code: {where} checked (sha256 {sha256})", file=sys.stderr)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv, os.environ))
