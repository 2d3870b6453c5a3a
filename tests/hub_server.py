"""A local stand-in for the Hugging Face hub (and any HTTP file server) for pull tests: Range requests,
throttling, failures, a CDN redirect. Used by tests/test_pull.py and the admin panel's pull tests.

It listens on 127.0.0.1, or on a LAN neighbour's address (`lan`: a `lan_netns.Lan`), which is how the
appliance's worker reaches it: its pull policy refuses this machine's addresses, and takes LAN ones when
the test switches `pull_from_lan` on."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class HubServer:
    """Serves `root/{repo}/{file}` as `/{repo}/resolve/{revision}/{file}`, with or without Range support.

    Knobs: `ranges`, `token` (required bearer token), `rate` (bytes/s throttle), `fail` (answer this many
    requests with 503 first), `down_after` (503 for every request once this many bytes went out),
    `cdn` (answer with a redirect to `{redirect_to}/cdn/...`, by default `http://localhost:PORT`, another
    host, as the hub does for large files); `served` counts body bytes sent, `cdn_auth` the CDN requests
    that carried a token.
    """

    def __init__(self, root: Path, lan=None):
        self.root = root
        self.ranges = True
        self.token = None
        self.rate = None
        self.fail = 0
        self.down_after = None
        self.cdn = False
        self.cdn_auth = 0
        self.served = 0
        self.requests = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                path = urllib.parse.unquote(self.path)
                if path.startswith("/cdn/"):
                    server.cdn_auth += "Authorization" in self.headers
                    return self._send(server.root / path[len("/cdn/") :])
                listing = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/?]+)(\?.*)?", path)
                if listing:  # the Hub's file list of a repository: every file, recursively
                    repo = server.root / listing.group(1)
                    files = sorted(p for p in repo.rglob("*") if p.is_file()) if repo.is_dir() else []
                    body = json.dumps(
                        [{"type": "file", "path": str(p.relative_to(repo)), "size": p.stat().st_size} for p in files]
                    ).encode()
                    self.send_response(200 if repo.is_dir() else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if server.fail > 0 or (server.down_after is not None and server.served >= server.down_after):
                    server.fail = max(0, server.fail - 1)
                    return self._status(503)
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._status(401)
                path = server.root / m.group(1) / m.group(3) if m else None
                if path is None or not path.is_file():
                    return self._status(404)
                if server.cdn:
                    self.send_response(302)
                    self.send_header("Location", f"{server.redirect_to}/cdn/{m.group(1)}/{m.group(3)}")
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                self._send(path)

            def _send(self, path):
                if not path.is_file():
                    return self._status(404)
                size = path.stat().st_size
                start, end = 0, size
                rng = self.headers.get("Range")
                if rng and server.ranges:
                    a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", rng).groups()
                    start, end = int(a), min(size, int(b) + 1 if b else size)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("ETag", f'"{size}"')
                self.end_headers()
                with open(path, "rb") as f:
                    f.seek(start)
                    left = end - start
                    while left:
                        block = f.read(min(65536, left))
                        try:
                            self.wfile.write(block)
                        except (BrokenPipeError, ConnectionResetError):
                            return
                        server.served += len(block)
                        left -= len(block)
                        if server.rate:
                            time.sleep(len(block) / server.rate)

            def _status(self, code):
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        if lan is None:
            self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:  # the socket made inside the namespace, served from here
            self.httpd = ThreadingHTTPServer((lan.ns_ip, 0), Handler, bind_and_activate=False)
            self.httpd.socket.close()
            self.httpd.socket = lan.listen()
            self.httpd.server_address = self.httpd.socket.getsockname()
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.redirect_to = f"http://localhost:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
