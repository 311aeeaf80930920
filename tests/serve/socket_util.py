"""Small socket helpers shared by the server's Python tests (127.0.0.1 only)."""
import socket


def free_port():
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recv_to_close(sock, tolerate=(socket.timeout,)):
    """Reads until the peer closes; an exception in `tolerate` ends the read with what came."""
    out = b""
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                break
            out += b
    except tolerate:
        pass
    return out
