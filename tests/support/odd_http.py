"""A loopback HTTP server that misbehaves the way a hostile or broken server would.

For the doctor and scan preflight tests: it trickles its answer one byte at a time (a
per-read timeout never fires), or redirects every request elsewhere. Each connection is
served on its own thread; ``close`` stops them all.
"""

from __future__ import annotations

import socket
import threading


class OddServer:
    """``trickle``: a valid-looking answer, one byte every ``interval_s``; ``redirect``: 302 to ``location``."""

    def __init__(self, mode: str, *, location: str = "", interval_s: float = 0.5) -> None:
        self.mode = mode
        self.location = location
        self.interval_s = interval_s
        self.connections = 0
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(5)
            try:
                connection.recv(65536)  # the request; its content does not matter
                if self.mode == "redirect":
                    connection.sendall(
                        f"HTTP/1.1 302 Found\r\nLocation: {self.location}\r\nContent-Length: 0\r\n\r\n".encode()
                    )
                    return
                answer = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"paths": '
                for byte in answer:
                    if self._closed.wait(self.interval_s):
                        return
                    connection.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._thread.join(timeout=5)
