"""A Dubbo 2 provider for the http-dubbo and dubbo-proxy end-to-end tests (tests/e2e/plugins_dubbo.rs).

It reads the gateway's frames on its own: the 16-byte header by Dubbo's layout, a Hessian 2
body with python-hessian's parser (`pyhessian`, from PyPI, installed by scripts/test.sh) and
a fastjson body as its lines, and answers with what it decoded so the test can check every
field. Answers are written here from the Hessian 2 specification
(http://hessian.caucho.com/doc/hessian-serialization.html), not with the gateway's codec.

It prints its port, then serves until killed. The method name picks the behaviour.
"""

import io
import json
import socket
import struct
import sys
import threading
import time

from pyhessian.parser import Parser, ParserV2
from pyhessian.protocol import Binary, Object

MAGIC = 0xDABB
HESSIAN2, FASTJSON = 2, 6

conn_ids = iter(range(1, 1 << 30))
conn_lock = threading.Lock()
# `hold` calls wait here until four have arrived (dubbo-proxy's multiplexing test).
barrier = threading.Barrier(4, timeout=20)


# --- Hessian 2 writing, from the specification --------------------------------------------


def h_int(v):
    if -0x10 <= v <= 0x2F:
        return bytes([v + 0x90])
    if -0x800 <= v <= 0x7FF:
        return bytes([0xC8 + (v >> 8), v & 0xFF])
    return b"I" + struct.pack(">i", v)


def h_str(s):
    # Lengths count UTF-16 units; the tests' strings stay in the BMP, where that is len().
    out = b""
    while len(s) > 0x8000:
        chunk, s = s[:0x8000], s[0x8000:]
        out += b"R" + struct.pack(">H", 0x8000) + chunk.encode("utf-8")
    n, data = len(s), s.encode("utf-8")
    if n <= 31:
        return out + bytes([n]) + data
    if n <= 1023:
        return out + bytes([0x30 + (n >> 8), n & 0xFF]) + data
    return out + b"S" + struct.pack(">H", n) + data


def h_bin(b):
    if len(b) <= 15:
        return bytes([0x20 + len(b)]) + b
    return b"B" + struct.pack(">H", len(b)) + b


def h_value(v):
    if v is None:
        return b"N"
    if v is True:
        return b"T"
    if v is False:
        return b"F"
    if isinstance(v, int):
        return h_int(v)
    if isinstance(v, str):
        return h_str(v)
    if isinstance(v, bytes):
        return h_bin(v)
    if isinstance(v, dict):
        return b"H" + b"".join(h_value(k) + h_value(x) for k, x in v.items()) + b"Z"
    raise TypeError(v)


def h_exception(message):
    # java.lang.RuntimeException as Java's Hessian writes a Throwable: a class definition,
    # then the instance.
    return (
        b"C" + h_str("java.lang.RuntimeException") + h_int(1) + h_str("detailMessage")
        + b"\x60" + h_str(message)
    )


# --- Reading ---------------------------------------------------------------------------------


def plain(v):
    """A decoded Hessian value as JSON."""
    if isinstance(v, Binary):
        return {"binary": v.value.decode("latin-1")}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, Object):
        return {k: plain(x) for k, x in v.__getstate__().items()}
    return v


def hessian_values(body):
    parser = Parser()
    parser._stream = io.BytesIO(body)
    adapter = ParserV2(base_parser=parser)
    values = []
    while parser._stream.tell() < len(body):
        values.append(adapter._read_object())
    return values


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def frame(flag, status, rid, body):
    return struct.pack(">HBBQI", MAGIC, flag, status, rid, len(body)) + body


# --- Calls -----------------------------------------------------------------------------------


def hessian_call(conn_id, flag, rid, body, send):
    values = hessian_values(body)
    dubbo, service, version, method, types = values[:5]
    args, attachments = values[5:-1], values[-1]
    record = {
        "conn": conn_id, "flag": flag, "id": rid, "dubbo": dubbo, "service": service,
        "version": version, "method": method, "types": types,
        "args": plain(args), "attachments": plain(attachments),
    }
    if version != "1.0.0":
        msg = "Not found exported service: %s:%s" % (service, version)
        return send(frame(HESSIAN2, 60, rid, h_str(msg)))
    value = None
    kind = 1
    if method == "hello":
        value = {"status": "200", "body": json.dumps(record), "x-dubbo": "yes"}
        for k, v in args[0].items():
            if k.startswith("extra-arg"):
                value["got-" + k] = v
    elif method == "fail":
        value = {"status": "503", "body": "dubbo fail\n"}
    elif method == "badStatus":
        value = {"status": 200, "body": "ok\n"}
    elif method == "bytes":
        value = {"body": args[0]["body"].value + b"!"}
    elif method == "long":
        value = {"body": "\u00e9" * 40000 + "end"}
    elif method == "timeout":
        time.sleep(1)
        value = {"status": "503", "body": "late\n"}
    elif method == "hold":
        barrier.wait()
        value = {"body": json.dumps(record)}
    elif method == "exception":
        return send(frame(HESSIAN2, 20, rid, h_int(0) + h_exception("boom")))
    elif method == "null":
        return send(frame(HESSIAN2, 20, rid, h_int(2)))
    elif method == "garbage":
        return send(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 32)
    elif method == "drop":
        raise EOFError
    else:
        value = {"status": "404", "body": "no method " + method}
    send(frame(HESSIAN2, 20, rid, h_int(kind) + h_value(value)))


def fastjson_call(flag, rid, body, send):
    lines = body.decode("utf-8").split("\n")
    record = {"flag": flag, "id": rid, "lines": lines}
    method = json.loads(lines[3])
    if method == "echo":
        out = "1\n" + json.dumps(record) + "\n"
    elif method == "withAttachments":
        out = "4\n" + json.dumps(record) + "\n{}\n"
    elif method == "nothing":
        out = "2\n"
    elif method == "boom":
        out = "0\n\"java.lang.RuntimeException: boom\"\n"
    elif method == "notFound":
        return send(frame(FASTJSON, 70, rid, b"\"not found\"\n"))
    elif method == "garbage":
        return send(b"\x00" * 20)
    elif method == "slow":
        time.sleep(1)
        out = "1\n\"late\"\n"
    elif method == "drop":
        raise EOFError
    else:
        out = "1\n\"unknown\"\n"
    send(frame(FASTJSON, 20, rid, out.encode("utf-8")))


def serve(sock):
    with conn_lock:
        conn_id = next(conn_ids)
    write_lock = threading.Lock()

    def send(data):
        with write_lock:
            sock.sendall(data)

    def one(flag, rid, body):
        try:
            if flag & 0x1F == HESSIAN2:
                hessian_call(conn_id, flag, rid, body, send)
            else:
                fastjson_call(flag, rid, body, send)
        except EOFError:
            sock.shutdown(socket.SHUT_RDWR)
        except Exception as e:  # noqa: BLE001 - the test reads the provider's stderr
            print("provider error: %r" % (e,), file=sys.stderr, flush=True)
            sock.shutdown(socket.SHUT_RDWR)

    try:
        while True:
            head = read_exact(sock, 16)
            magic, flag, _status, rid, length = struct.unpack(">HBBQI", head)
            if magic != MAGIC:
                print("bad magic %x" % magic, file=sys.stderr, flush=True)
                return
            body = read_exact(sock, length)
            # Each call on its own thread: answers may leave in another order than the calls.
            threading.Thread(target=one, args=(flag, rid, body), daemon=True).start()
    except (EOFError, OSError):
        pass


def main():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve, args=(sock,), daemon=True).start()


if __name__ == "__main__":
    main()
