"""A pre-signed link to one object in S3 (or an S3-compatible store): what the Prefect UI
links an HTML report in object storage with, since no browser opens an ``s3://`` URL.

AWS's Signature Version 4 in the query string, computed here (pyarrow's S3 file system
signs nothing, and boto3 is no dependency): a GET of that one object, for `EXPIRES` (7
days: S3's longest). It needs long-term keys (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``): a link signed with temporary credentials carries their
session token, which would then sit in the Prefect database for whoever reads artifacts,
so none is made with one (`presigned` says why instead).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlsplit

#: How long a link opens its object: S3's longest for a Signature Version 4 link.
EXPIRES = 7 * 24 * 3600


@dataclass(frozen=True)
class Signed:
    """A pre-signed link and when it stops opening its object."""

    url: str
    expires: dt.datetime


def _key(secret: str, date: str, region: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _where(url: str, env: Mapping[str, str]) -> tuple[str, str, str, str]:
    """The link's scheme, host, path and the store's region, from an ``s3://`` URL and its
    options (``endpoint_override``, ``scheme``, ``region``) or the environment's."""
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query))
    bucket, key = parts.netloc, parts.path.lstrip("/")
    region = options.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = options.get("endpoint_override")
    if endpoint:
        return options.get("scheme", "https"), endpoint, f"/{bucket}/{key}", region
    given = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if given:
        found = urlsplit(given)
        return found.scheme, found.netloc, f"{found.path.rstrip('/')}/{bucket}/{key}", region
    return "https", f"{bucket}.s3.{region}.amazonaws.com", f"/{key}", region


def presigned(url: str, now: dt.datetime | None = None,
              env: Mapping[str, str] | None = None) -> Signed | str:
    """A link that opens the object at ``url`` (``s3://bucket/key``, with the options a
    results URL takes) for `EXPIRES`, or why none can be made."""
    env = os.environ if env is None else env
    if not url.startswith("s3://"):
        return f"no pre-signed link for {url.split('://', 1)[0]}:// objects (S3 only)"
    access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if env.get("AWS_SESSION_TOKEN"):
        return "not signed: temporary credentials would put their session token in the link"
    if not access or not secret:
        return "not signed: no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY here"
    scheme, host, path, region = _where(url, env)
    now = now or dt.datetime.now(dt.UTC)
    stamp, date = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    scope = f"{date}/{region}/s3/aws4_request"
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted({
        "X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{access}/{scope}",
        "X-Amz-Date": stamp, "X-Amz-Expires": str(EXPIRES), "X-Amz-SignedHeaders": "host"}.items()))
    path = quote(path, safe="/~")
    request = f"GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
    to_sign = (f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n"
               + hashlib.sha256(request.encode()).hexdigest())
    signature = hmac.new(_key(secret, date, region), to_sign.encode(), hashlib.sha256).hexdigest()
    return Signed(f"{scheme}://{host}{path}?{query}&X-Amz-Signature={signature}",
                  now + dt.timedelta(seconds=EXPIRES))
