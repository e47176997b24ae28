"""Artifacts in an S3-compatible object store (:mod:`kernel.artifacts`), so deployments
can keep large values out of the database: one object per digest under a prefix.

An S3 ``PUT`` makes an object visible only once all of it is stored (and the store
checks the body against the ``Content-MD5`` sent with it), so an artifact is complete
or absent, never half there; storing it again replaces it whole and restarts its grace
period (its ``LastModified``). Reads check the hash. The sweep lists objects older than
the grace period and deletes the ones no record references.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from kernel.artifacts import GRACE, MissingArtifact, check, digest_of

MISSING = ("NoSuchKey", "404", "NotFound")


class S3Artifacts:
    """``client``: a boto3 S3 client (its endpoint names the store); ``bucket`` must
    exist (:meth:`ensure_bucket` makes it)."""

    def __init__(self, client: Any, bucket: str, prefix: str = "artifacts/") -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    @classmethod
    def connect(cls, endpoint: str, bucket: str, region: str = "us-east-1") -> S3Artifacts:
        """A store at ``endpoint`` (credentials from the usual AWS environment)."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=endpoint, region_name=region,
                              config=Config(s3={"addressing_style": "path"},
                                            retries={"max_attempts": 3, "mode": "standard"}))
        return cls(client, bucket)

    def ensure_bucket(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except self.client.exceptions.ClientError:
            self.client.create_bucket(Bucket=self.bucket)

    def key(self, digest: str) -> str:
        return self.prefix + digest.replace(":", "/")

    def put(self, data: bytes, media_type: str) -> str:
        digest = digest_of(data)
        md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        self.client.put_object(Bucket=self.bucket, Key=self.key(digest), Body=data,
                               ContentType=media_type, ContentMD5=md5)
        return digest

    def _object(self, digest: str) -> Any:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(digest))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING:
                raise MissingArtifact(f"no artifact {digest}") from exc
            raise

    def get(self, digest: str) -> bytes:
        found = self._object(digest)
        return check(digest, found["Body"].read())

    def media_type(self, digest: str) -> str:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in MISSING:
                raise MissingArtifact(f"no artifact {digest}") from exc
            raise
        return str(head.get("ContentType") or "application/octet-stream")

    def sweep(self, referenced: Callable[[Iterable[str]], set[str]], now: datetime,
              grace: timedelta = GRACE) -> int:
        before = now - grace
        old: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            for item in page.get("Contents", []):
                if item["LastModified"] < before:
                    old.append(item["Key"][len(self.prefix):].replace("/", ":", 1))
        if not old:
            return 0
        kept = referenced(old)
        removed = 0
        for digest in old:
            if digest in kept:
                continue
            # Stored again since it was listed: young again, its reference may be coming.
            head = self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
            if head["LastModified"] < before:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(digest))
                removed += 1
        return removed
