#!/usr/bin/env python3
"""An HTTP/3 client for tests/e2e/http3.rs, on aioquic (PyPI; scripts/test.sh installs it).

Reads a job as JSON on stdin:
  {"host": "127.0.0.1", "port": 9443, "sni": "server.local", "ca": "<PEM file>",
   "requests": [{"method": "GET", "path": "/x", "headers": [["k", "v"]],
                 "body": "text", "body_size": 0}]}
sends the requests over one QUIC connection, one after the other, and prints one JSON object:
  {"responses": [{"status": 200, "headers": [[k, v]], "trailers": [[k, v]],
                  "body": "<text, first 64 KiB>", "body_len": n, "body_sha256": "<hex>"}],
   "peer_cn": "<the server certificate's subject>", "error": null}
A failed handshake or a reset stream ends the run with "error" set.
"""

import asyncio
import hashlib
import json
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset

KEEP = 64 * 1024


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}

    def quic_event_received(self, event):
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            st = self.streams[event.stream_id]
            if not st["done"].done():
                st["done"].set_exception(
                    RuntimeError(f"stream reset, error code {event.error_code}")
                )
        if isinstance(event, ConnectionTerminated):
            for st in self.streams.values():
                if not st["done"].done():
                    st["done"].set_exception(
                        RuntimeError(
                            f"connection closed, error code {event.error_code}: {event.reason_phrase}"
                        )
                    )
        for ev in self.h3.handle_event(event):
            st = self.streams.get(getattr(ev, "stream_id", None))
            if st is None:
                continue
            if isinstance(ev, HeadersReceived):
                if st["headers"] is None:
                    st["headers"] = ev.headers
                else:
                    st["trailers"] = ev.headers
            elif isinstance(ev, DataReceived):
                st["len"] += len(ev.data)
                st["sha"].update(ev.data)
                if len(st["body"]) < KEEP:
                    st["body"].extend(ev.data[: KEEP - len(st["body"])])
            if getattr(ev, "stream_ended", False) and not st["done"].done():
                st["done"].set_result(True)

    async def request(self, authority, req):
        sid = self._quic.get_next_available_stream_id()
        st = {
            "headers": None,
            "trailers": [],
            "body": bytearray(),
            "len": 0,
            "sha": hashlib.sha256(),
            "done": self._loop.create_future(),
        }
        self.streams[sid] = st
        body = req.get("body", "").encode()
        if req.get("body_size"):
            body = bytes(i % 251 for i in range(req["body_size"]))
        headers = [
            (b":method", req.get("method", "GET").encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", req["path"].encode()),
        ] + [(k.lower().encode(), v.encode()) for k, v in req.get("headers", [])]
        self.h3.send_headers(sid, headers, end_stream=not body)
        if body:
            # In pieces, so a large body goes as several DATA frames.
            step = 16 * 1024
            for i in range(0, len(body), step):
                self.h3.send_data(sid, body[i : i + step], end_stream=i + step >= len(body))
                self.transmit()
                await asyncio.sleep(0)
        self.transmit()
        await st["done"]
        status = None
        out_headers = []
        for k, v in st["headers"] or []:
            if k == b":status":
                status = int(v)
            else:
                out_headers.append([k.decode(), v.decode()])
        return {
            "status": status,
            "headers": out_headers,
            "trailers": [[k.decode(), v.decode()] for k, v in st["trailers"]],
            "body": st["body"].decode("utf-8", "replace"),
            "body_len": st["len"],
            "body_sha256": st["sha"].hexdigest(),
        }


async def run(job):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = job["sni"]
    config.load_verify_locations(job["ca"])
    config.verify_mode = ssl.CERT_REQUIRED
    authority = job.get("authority", f"{job['sni']}:{job['port']}")
    result = {"responses": [], "peer_cn": None, "error": None}
    try:
        async with connect(
            job["host"],
            job["port"],
            configuration=config,
            create_protocol=Client,
            wait_connected=True,
        ) as client:
            cert = getattr(client._quic.tls, "_peer_certificate", None)
            if cert is not None:
                result["peer_cn"] = cert.subject.rfc4514_string()
            for req in job["requests"]:
                result["responses"].append(await client.request(authority, req))
    except Exception as e:  # the test reads the failure
        result["error"] = f"{type(e).__name__}: {e}"
    return result


def main():
    job = json.load(sys.stdin)
    timeout = job.get("timeout", 20)
    try:
        result = asyncio.run(asyncio.wait_for(run(job), timeout))
    except asyncio.TimeoutError:
        result = {"responses": [], "peer_cn": None, "error": "timed out"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
