"""A free loopback port, for servers a test starts or URLs where nothing listens."""

from __future__ import annotations

from miles_nemogym.gym.server import free_port as _free_port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds, outside the ephemeral range (as ``serve`` picks)."""
    return _free_port("127.0.0.1")


def port_in_time_wait() -> int:
    """A loopback port a stopped server left in TIME_WAIT (it closed an accepted connection first)."""
    import socket

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)  # the close reached the client
    return port
