"""An S3 server for tests (moto's server mode on 127.0.0.1) and a small fault-injecting proxy in
front of it: the faults an object store produces, on purpose, on the wire.

`FaultProxy` forwards every request to moto unchanged, except that it can
- answer the next N matching requests with an error (500 InternalError, 503 SlowDown throttling),
- hold matching requests until the test releases them (two writers of one key at the same
  moment, a multipart upload whose writer is killed between two parts),
- shift every time it reports (the `Last-Modified` header, `<LastModified>` and `<Initiated>` in
  listings) by `skew_s` seconds: a store whose clock is behind or ahead of this host's.
It records each request (method, path, query, status) so a test can count the tries.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "x",
               "AWS_DEFAULT_REGION": "us-east-1"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "te", "trailer",
              "upgrade", "proxy-connection"}
ERRORS = {500: ("InternalError", "We encountered an internal error. Please try again."),
          503: ("SlowDown", "Please reduce your request rate.")}
_ISO_TAG = re.compile(rb"<(LastModified|Initiated)>([^<]+)</\1>")


@contextmanager
def moto_server(bucket: str = "race-test") -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with `bucket` created; yields its endpoint URL. Sets the dummy
    credentials botocore needs in this process's environment for the block.

    The server is a process of its own (`moto_server`), not moto's in-process thread: that one imports
    Flask into the test process, and vLLM's in-process engine (tests/conftest.py) scans every module's
    attributes when it starts, where Flask's `current_app` proxy raises outside an app context."""
    import boto3

    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint + "/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server on port {port} did not answer (exit code {server.poll()})") from None
                time.sleep(0.2)
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def storage_options(endpoint: str) -> dict[str, Any]:
    """An `ArtifactStore`'s storage options for the server (or proxy) at `endpoint`."""
    return {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def child_env(endpoint: str) -> dict[str, str]:
    """What a `race` child process needs to reach the store at `endpoint` (botocore reads these)."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint}


@dataclass
class Rule:
    """Requests of `method` whose path and query match `pattern`, affected `times` times (None: always)."""

    method: str
    pattern: re.Pattern[str]
    action: str  # "error" or "hold"
    times: int | None
    status: int = 0
    hits: int = 0
    arrived: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    released: threading.Event = field(default_factory=threading.Event)

    def takes(self, method: str, target: str) -> bool:
        if method != self.method or not self.pattern.search(target):
            return False
        if self.times is not None and self.hits >= self.times:
            return False
        self.hits += 1
        return True

    def wait_arrived(self, count: int = 1, timeout: float = 60) -> None:
        """Block until `count` requests are held here."""
        for _ in range(count):
            if not self.arrived.acquire(timeout=timeout):
                raise TimeoutError(f"no {self.method} matching {self.pattern.pattern!r} arrived")


class FaultProxy:
    """The proxy (module doc). `url` is its endpoint; use as a context manager."""

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream)
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str, str, int]] = []
        self.skew_s = 0.0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._serve(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for rule in self.rules:
            rule.released.set()
        self.server.shutdown()
        self.server.server_close()

    # -- faults ---------------------------------------------------------------------------------
    def fail(self, method: str, pattern: str, status: int, times: int | None) -> Rule:
        """Answer the next `times` matching requests (None: all) with `status` (500 or 503)."""
        return self._add(Rule(method, re.compile(pattern), "error", times, status=status))

    def hold(self, method: str, pattern: str, times: int | None = None) -> Rule:
        """Hold matching requests until `rule.released` is set (then forward them)."""
        return self._add(Rule(method, re.compile(pattern), "hold", times))

    def _add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        for rule in self.rules:
            rule.released.set()
        with self._lock:
            self.rules, self.requests = [], []

    def count(self, method: str, pattern: str) -> int:
        """Requests of `method` whose path and query matched `pattern` so far (answered or not)."""
        return sum(1 for m, path, query, _ in self.requests if m == method and re.search(pattern, f"{path}?{query}"))

    # -- forwarding -----------------------------------------------------------------------------
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        method, target = handler.command, handler.path
        body, chunked = _read_body(handler)
        with self._lock:
            rule = next((r for r in self.rules if r.takes(method, target)), None)
        parts = urlsplit(target)
        if rule is not None and rule.action == "error":
            self._record(method, parts, rule.status)
            code, message = ERRORS[rule.status]
            _answer(handler, rule.status, {"Content-Type": "application/xml"}, (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<RequestId>{uuid.uuid4().hex}</RequestId></Error>").encode())
            return
        if rule is not None:  # hold
            rule.arrived.release()
            rule.released.wait()
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP}
            if chunked:
                headers["Transfer-Encoding"] = "chunked"
            else:
                headers["Content-Length"] = str(len(body))
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
            reply = {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP}
        finally:
            connection.close()
        self._record(method, parts, response.status)
        if self.skew_s:
            reply, data = self._skewed(reply, data)
        length = response.getheader("Content-Length") if method == "HEAD" else None
        _answer(handler, response.status, reply, data, head_length=length)

    def _record(self, method: str, parts: Any, status: int) -> None:
        with self._lock:
            self.requests.append((method, parts.path, parts.query, status))

    def _skewed(self, headers: dict[str, str], data: bytes) -> tuple[dict[str, str], bytes]:
        shift = timedelta(seconds=self.skew_s)
        for key, value in headers.items():
            if key.lower() == "last-modified":
                headers[key] = format_datetime(parsedate_to_datetime(value) + shift, usegmt=True)

        def iso(match: re.Match[bytes]) -> bytes:
            when = datetime.fromisoformat(match.group(2).decode().replace("Z", "+00:00")) + shift
            text = when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
            return b"<%s>%s</%s>" % (match.group(1), text.encode(), match.group(1))

        return headers, _ISO_TAG.sub(iso, data)


def _read_body(handler: BaseHTTPRequestHandler) -> tuple[bytes, bool]:
    """The request body as sent (chunked framing kept), and whether it was chunked."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        raw = bytearray()
        while True:
            line = handler.rfile.readline()
            raw += line
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = handler.rfile.readline()
                    raw += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return bytes(raw), True
            raw += handler.rfile.read(size + 2)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0)), False


def _answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes,
            head_length: str | None = None) -> None:
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", head_length if head_length is not None else str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)
