"""`npr storage init s3://bucket/prefix`: S3 for DVC in one command.

1. The bucket: it must exist before the first `dvc push` (DVC does not create buckets). ``head_bucket``;
   when it is missing and ``create`` allows it, ``create_bucket`` (in ``AWS_DEFAULT_REGION``/``AWS_REGION``
   outside us-east-1); when these credentials may not create it, one line saying how to create it.
2. The DVC remote: ``remote "<name>"`` with that URL and, unless ``default=False``, ``core.remote``, in the
   git-ignored ``.dvc/config.local`` (this machine only; nothing secret or per-machine goes in git).
3. A probe object through DVC's own filesystem for that remote (the credentials, endpoint and client DVC
   will use): written under the prefix, read back, compared and removed.

Endpoint and credentials come from the environment as for DVC itself (``AWS_ENDPOINT_URL``,
``AWS_PROFILE`` or ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``). Every failure is a ``StorageInitError``
(a user error: one line, exit 2) naming the bucket and what to do.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

from components.errors import UserError


class StorageInitError(UserError, RuntimeError):
    """The bucket, the DVC remote or the probe failed; the message says which and what to do."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix); the prefix may be empty."""
    if not url.startswith("s3://"):
        raise StorageInitError(f"{url!r} is not an s3:// URL (expected s3://bucket/prefix)")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket or any(c in bucket for c in " \\"):
        raise StorageInitError(f"{url!r}: no bucket name (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def _client() -> Any:
    import boto3  # lazy: boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)


def _code(err: Exception) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def ensure_bucket(bucket: str, create: bool) -> bool:
    """Make sure the bucket exists; returns whether it was created here."""
    from botocore.exceptions import BotoCoreError, ClientError  # lazy: botocore

    client = _client()
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as err:
        if _code(err) not in ("404", "NoSuchBucket", "NotFound"):
            raise StorageInitError(
                f"bucket {bucket}: {_code(err) or err} (these credentials cannot read it; check AWS_PROFILE "
                "or the keys, or the bucket's policy)"
            ) from None
    except BotoCoreError as err:
        raise StorageInitError(f"bucket {bucket}: cannot reach S3 ({err}); check AWS_ENDPOINT_URL") from None
    how = f"`aws s3 mb s3://{bucket}` (add --endpoint-url for a non-AWS S3), or ask the account's admin"
    if not create:
        raise StorageInitError(f"bucket {bucket} does not exist (and --no-create): create it with {how}")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    kwargs: dict[str, Any] = {"Bucket": bucket}
    if region != "us-east-1":
        kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**kwargs)
    except ClientError as err:
        raise StorageInitError(
            f"bucket {bucket} does not exist and could not be created ({_code(err) or err}): create it with "
            f"{how}, then run this again"
        ) from None
    return True


def configure_remote(root: Path, name: str, url: str, default: bool) -> Path:
    """``remote "<name>"`` = url (and ``core.remote``) in ``.dvc/config.local``; returns that file."""
    from dvc.repo import Repo  # lazy: dvc

    try:
        repo = Repo(str(root))
    except Exception as err:  # noqa: BLE001 - DVC's NotDvcRepoError and friends
        raise StorageInitError(f"{root}: not a DVC repository ({err}); run this in the checkout") from None
    with repo.config.edit("local") as conf:
        conf["remote"][name] = {**conf["remote"].get(name, {}), "url": url}
        if default:
            conf["core"]["remote"] = name
    return Path(repo.dvc_dir) / "config.local"


def probe_remote(root: Path, name: str) -> str:
    """Write, read back and remove a probe object through DVC's filesystem for the remote."""
    from dvc.repo import Repo  # lazy: dvc

    repo = Repo(str(root))
    odb = repo.cloud.get_remote_odb(name)
    fs, path = odb.fs, odb.fs.join(odb.path, f".npr-probe-{uuid.uuid4().hex}")
    data = f"npr storage probe {uuid.uuid4().hex}\n".encode()
    try:
        fs.pipe_file(path, data)
        back = fs.cat_file(path)
    except Exception as err:  # noqa: BLE001 - s3fs/botocore errors of every kind
        raise StorageInitError(
            f"remote {name} ({odb.path}): the probe object could not be written or read: {err}"
        ) from None
    finally:
        with contextlib.suppress(Exception):  # already gone, or never written
            fs.rm_file(path)
    if back != data:
        raise StorageInitError(f"remote {name}: the probe object read back differs from what was written")
    return f"ok ({len(data)} bytes written, read back and removed)"


def init_s3(
    url: str, root: Path | str = ".", remote: str = "s3", create: bool = True, default: bool = True
) -> dict[str, Any]:
    """Bucket, DVC remote, probe (module docstring). Returns what was done."""
    bucket, prefix = parse_s3_url(url)
    root = Path(root)
    created = ensure_bucket(bucket, create)
    config = configure_remote(
        root, remote, f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}", default
    )
    probe = probe_remote(root, remote)
    return {
        "bucket": bucket,
        "prefix": prefix,
        "created": created,
        "remote": remote,
        "default": default,
        "config": str(config),
        "probe": probe,
    }
