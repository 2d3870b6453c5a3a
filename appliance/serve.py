"""daphne, with a body over the size limit refused at its Content-Length header (`python -m appliance.serve`).

daphne (through twisted.web) buffers a request's whole body before it calls the application, and
then queues it to the application in one go: a 200 MB body grew the process by 200 MB before any
view could answer 401 or 413. Here twisted's `gotLength` hook, which runs when the headers are in,
swaps the body's buffer for a sink when the length is over `DATA_UPLOAD_MAX_MEMORY_SIZE`; the
request is then answered 413 (in the API's error format, `webui.door`; a page's form: 303 back to its
page) without reaching Django. A chunked body has no length up front: `handleContentChunk` counts it
and swaps in the sink once past the limit. (twisted still receives the rest of a refused body before it
lets us answer.)
"""

from __future__ import annotations

import io
import os

from daphne import http_protocol
from daphne.cli import CommandLineInterface


class _Sink(io.BytesIO):
    """A file that forgets what is written to it: the body of a refused request."""

    def write(self, data) -> int:
        return len(data)


def _limit() -> int:
    from django.conf import settings

    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


_got_length = http_protocol.WebRequest.gotLength
_content_chunk = http_protocol.WebRequest.handleContentChunk
_process = http_protocol.WebRequest.process


def _refuse(self) -> None:
    if hasattr(self.content, "close"):
        self.content.close()
    self.content = _Sink()
    self.rkmojo_too_large = True


def got_length(self, length):
    if length is not None and length > _limit():
        return _refuse(self)
    _got_length(self, length)


def content_chunk(self, data):
    # a chunked body has no length up front: count it as it comes, and stop keeping it past the limit
    self.rkmojo_seen = getattr(self, "rkmojo_seen", 0) + len(data)
    if not getattr(self, "rkmojo_too_large", False) and self.rkmojo_seen > _limit():
        _refuse(self)
    _content_chunk(self, data)


def process(self):
    if not getattr(self, "rkmojo_too_large", False):
        return _process(self)
    from django.utils.module_loading import import_string

    too_large_response = import_string("webui.door.too_large_response")  # by name, as in `appliance.asgi`
    status, headers, body = too_large_response(self.path.decode("latin-1"), _limit())
    self.setResponseCode(status)
    for name, value in headers:
        self.setHeader(name, value)
    self.setHeader(b"Connection", b"close")
    self.write(body)
    self.finish()


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
    http_protocol.WebRequest.gotLength = got_length
    http_protocol.WebRequest.handleContentChunk = content_chunk
    http_protocol.WebRequest.process = process
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
