"""Fixtures of the ops tests: real services started here and stopped here."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from ops_testing import S3Server


@pytest.fixture()
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A fresh moto S3 with the credentials and endpoint DVC/boto read from the environment."""
    from moto.moto_api._internal.models import moto_api_backend

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto_api_backend.reset()
    server = S3Server()
    server.start()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": server.endpoint,
        # one botocore attempt per call: our own retry loop (components.storage) is what is under test
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_RETRY_MODE": "standard",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield server
    server.stop()
    moto_api_backend.reset()
