"""AWS Signature Version 4 verification, with dq tokens as the secret keys.

With ``DQ_TOKENS`` set, every SQS request must carry ``Authorization: AWS4-HMAC-SHA256
Credential=<key id>/<date>/<region>/sqs/aws4_request, SignedHeaders=..., Signature=...``
made with one of the tokens as the secret access key. We recompute the signature from
the request as received (canonical request → string to sign → HMAC chain) and compare;
a signature that is merely present proves nothing. The access key id may be anything:
it names the caller (``SenderId``), the token is the secret. Without tokens nothing is
checked. Presigned URLs (signature in the query string) are not accepted.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote

from dq.server.sqs.errors import SqsError

__all__ = ["Caller", "verify"]

_ALGORITHM = "AWS4-HMAC-SHA256"
#: Requests signed further than this from the server's clock are refused, as AWS does.
MAX_SKEW_S = 15 * 60


@dataclass(frozen=True, slots=True)
class Caller:
    """Who signed: the access key id and the region of the credential scope."""

    access_key: str
    region: str


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _canonical_query(query: bytes) -> str:
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    enc = [(quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs]
    return "&".join(f"{k}={v}" for k, v in sorted(enc))


def _header_values(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in headers:
        out.setdefault(k.decode("latin-1").lower(), []).append(v.decode("latin-1"))
    return out


def _string_to_sign(
    method: str,
    path: str,
    query: bytes,
    values: dict[str, list[str]],
    signed: Sequence[str],
    payload_hash: str,
    amz_date: str,
    scope: str,
) -> str:
    canonical_headers = "".join(
        f"{name}:{','.join(' '.join(v.split()) for v in values.get(name, []))}\n" for name in signed
    )
    canonical = "\n".join(
        [
            method.upper(),
            quote(path or "/", safe="/~"),
            _canonical_query(query),
            canonical_headers,
            ";".join(signed),
            payload_hash,
        ]
    )
    return f"{_ALGORITHM}\n{amz_date}\n{scope}\n{_sha256(canonical.encode())}"


def _signature(secret: str, scope_parts: Sequence[str], string_to_sign: str) -> str:
    key = ("AWS4" + secret).encode()
    for part in scope_parts:
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def _parse_authorization(header: str) -> tuple[str, list[str], list[str], str]:
    """(access key, scope parts, signed header names, signature) or ``IncompleteSignature``."""
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != _ALGORITHM:
        raise SqsError("IncompleteSignature", f"Unsupported authorization algorithm {algorithm!r}.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        k, _, v = part.strip().partition("=")
        fields[k] = v
    try:
        credential = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        signature = fields["Signature"]
    except KeyError as exc:
        raise SqsError(
            "IncompleteSignature", f"Authorization header requires '{exc.args[0]}' parameter."
        ) from None
    if len(credential) != 5 or credential[4] != "aws4_request" or not signature:
        raise SqsError("IncompleteSignature", "The credential scope is malformed.")
    return credential[0], credential[1:], signed, signature


def _parse_amz_date(amz_date: str) -> float:
    try:
        return calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SqsError("IncompleteSignature", f"Invalid X-Amz-Date {amz_date!r}.") from None


def verify(
    method: str,
    path: str,
    query: bytes,
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
    secrets: Sequence[str],
    now: float | None = None,
) -> Caller:
    """The caller if the request is signed with one of ``secrets``, else raise."""
    values = _header_values(headers)
    auth = values.get("authorization")
    if not auth:
        raise SqsError(
            "MissingAuthenticationToken",
            "The request must contain a Signature Version 4 Authorization header "
            "made with a dq token as the secret access key.",
        )
    access_key, scope_parts, signed, signature = _parse_authorization(auth[0])
    if "host" not in signed:
        raise SqsError("IncompleteSignature", "The Host header must be signed.")
    amz_date = (values.get("x-amz-date") or [""])[0]
    if not amz_date or "x-amz-date" not in signed:
        raise SqsError("IncompleteSignature", "The X-Amz-Date header must be present and signed.")
    signed_at = _parse_amz_date(amz_date)
    clock = time.time() if now is None else now
    if abs(clock - signed_at) > MAX_SKEW_S:
        raise SqsError(
            "SignatureDoesNotMatch",
            f"Signature expired: {amz_date} is more than 15 minutes from the server's time.",
        )
    if scope_parts[0] != amz_date[:8] or scope_parts[2] != "sqs":
        raise SqsError("SignatureDoesNotMatch", "The credential scope does not match the request.")
    payload_hash = _sha256(body)
    declared = values.get("x-amz-content-sha256")
    if declared and declared[0] != payload_hash:
        raise SqsError("SignatureDoesNotMatch", "The body does not match x-amz-content-sha256.")
    to_sign = _string_to_sign(
        method, path, query, values, signed, payload_hash, amz_date, "/".join(scope_parts)
    )
    given = signature.encode()
    for secret in secrets:
        if hmac.compare_digest(given, _signature(secret, scope_parts, to_sign).encode()):
            return Caller(access_key, scope_parts[1])
    raise SqsError(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your AWS Secret Access Key (a dq token) and signing method.",
    )
