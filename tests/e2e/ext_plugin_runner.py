"""An APISIX plugin runner for ferrisix's end-to-end tests (tests/e2e/ext_plugin.rs).

It speaks APISIX's runner protocol with the `a6pluginprotos` package (the protocol's published
Python definitions) on the socket named by APISIX_LISTEN_ADDRESS, as a runner started by
`ext-plugin.cmd` does. a6pluginprotos 0.2.1 predates a few fields of ext-plugin.fbs
(Rewrite.resp_headers and Rewrite.body, HTTPRespCall, ExtraInfo.RespBody): those are built
and read here with the flatbuffers package directly, by their field numbers in the .fbs.

What it does for a request depends on the conf the route gives it (`conf` entries):
  mode=stop       stop with `status`, two X-Runner headers and `body`
  mode=continue   answer with no action: the request goes on unchanged (the benchmark's
                  pre-req round trip, benches/e2e/bench.py)
  mode=rewrite    rewrite path, headers, args, response headers and body
  mode=var        ask for the variables named in `vars` (comma separated), stop with them
  mode=body       ask for the request body, stop with it
  mode=stats      stop with this runner's pid and counters as JSON
  mode=garbage    answer a frame whose payload is not a flatbuffer
  mode=badtype    answer a frame of an unknown type
  mode=slow       wait `delay` seconds, then stop with 200
  mode=die        exit while the request waits for the answer
  mode=resp       (post-resp) ask for the response body, answer it upper-cased with status
                  `status` (0: keep) and an X-Post-Resp header
  mode=resp_keep  (post-resp) answer nothing: the upstream's answer goes on
  mode=resp_status (post-resp) answer `status` only: the upstream's body goes on unread
  mode=resp_req   (post-resp) ask for the request body and `uri`, answer them as the body
  mode=resp_garbage (post-resp) answer a frame whose payload is not a flatbuffer
  forget=1        answer "conf token not found" to the first call of the conf
"""

import asyncio
import json
import os
import sys
import time

import flatbuffers
from flatbuffers import number_types as N
from flatbuffers.table import Table

from A6 import TextEntry
from A6.Err import Code as ErrCode
from A6.Err import Resp as ErrResp
from A6.ExtraInfo import Info as ExtraInfoKind
from A6.ExtraInfo import Req as ExtraReq
from A6.ExtraInfo import Resp as ExtraResp
from A6.ExtraInfo import Var as ExtraVar
from A6.ExtraInfo import ReqBody as ExtraReqBody
from A6.HTTPReqCall import Action as ReqAction
from A6.HTTPReqCall import Req as HttpReq
from A6.HTTPReqCall import Resp as HttpResp
from A6.HTTPReqCall import Stop as HttpStop
from A6.PrepareConf import Req as PrepReq
from A6.PrepareConf import Resp as PrepResp

RPC_ERROR, RPC_PREPARE_CONF, RPC_HTTP_REQ_CALL, RPC_EXTRA_INFO, RPC_HTTP_RESP_CALL = 0, 1, 2, 3, 4
INFO_RESP_BODY = 3  # ExtraInfo.Info.RespBody, newer than a6pluginprotos 0.2.1

confs = {}  # token -> {name: value}
forgotten = set()  # conf keys whose token was forgotten once
stats = {"prepares": 0, "calls": 0, "extra_info": 0}
next_token = [1]


def log(*args):
    print("runner:", *args, flush=True)


def frame(ty, data):
    n = len(data)
    return bytes([ty, (n >> 16) & 255, (n >> 8) & 255, n & 255]) + bytes(data)


async def read_frame(reader):
    hdr = await reader.readexactly(4)
    n = (hdr[1] << 16) | (hdr[2] << 8) | hdr[3]
    data = await reader.readexactly(n) if n else b""
    return hdr[0], data


def text_entries(b, pairs):
    offs = []
    for name, value in pairs:
        n = b.CreateString(name)
        v = b.CreateString(value) if value is not None else None
        TextEntry.Start(b)
        TextEntry.AddName(b, n)
        if v is not None:
            TextEntry.AddValue(b, v)
        offs.append(TextEntry.End(b))
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def err(code):
    b = flatbuffers.Builder(0)
    ErrResp.Start(b)
    ErrResp.AddCode(b, code)
    b.Finish(ErrResp.End(b))
    return frame(RPC_ERROR, b.Output())


def stop(req_id, status, headers=(), body=b""):
    b = flatbuffers.Builder(0)
    hv = text_entries(b, headers)
    bv = b.CreateByteVector(body) if body else None
    HttpStop.Start(b)
    HttpStop.AddStatus(b, status)
    HttpStop.AddHeaders(b, hv)
    if bv is not None:
        HttpStop.AddBody(b, bv)
    s = HttpStop.End(b)
    HttpResp.Start(b)
    HttpResp.AddId(b, req_id)
    HttpResp.AddActionType(b, ReqAction.Action.Stop)
    HttpResp.AddAction(b, s)
    b.Finish(HttpResp.End(b))
    return frame(RPC_HTTP_REQ_CALL, b.Output())


def go_on(req_id):
    b = flatbuffers.Builder(0)
    HttpResp.Start(b)
    HttpResp.AddId(b, req_id)
    b.Finish(HttpResp.End(b))
    return frame(RPC_HTTP_REQ_CALL, b.Output())


def rewrite(req_id, path, headers, args, resp_headers, body):
    """HTTPReqCall.Rewrite with all five fields of ext-plugin.fbs."""
    b = flatbuffers.Builder(0)
    p = b.CreateString(path) if path else None
    hv = text_entries(b, headers)
    av = text_entries(b, args)
    rv = text_entries(b, resp_headers)
    bv = b.CreateByteVector(body) if body else None
    b.StartObject(5)
    if p is not None:
        b.PrependUOffsetTRelativeSlot(0, p, 0)
    b.PrependUOffsetTRelativeSlot(1, hv, 0)
    b.PrependUOffsetTRelativeSlot(2, av, 0)
    b.PrependUOffsetTRelativeSlot(3, rv, 0)
    if bv is not None:
        b.PrependUOffsetTRelativeSlot(4, bv, 0)
    r = b.EndObject()
    HttpResp.Start(b)
    HttpResp.AddId(b, req_id)
    HttpResp.AddActionType(b, ReqAction.Action.Rewrite)
    HttpResp.AddAction(b, r)
    b.Finish(HttpResp.End(b))
    return frame(RPC_HTTP_REQ_CALL, b.Output())


async def ask(reader, writer, kind, name=None):
    """One extra-info round trip; the gateway's answer as bytes (None: no result)."""
    b = flatbuffers.Builder(0)
    if kind == ExtraInfoKind.Info.Var:
        n = b.CreateString(name)
        ExtraVar.Start(b)
        ExtraVar.AddName(b, n)
        info = ExtraVar.End(b)
    elif kind == ExtraInfoKind.Info.ReqBody:
        ExtraReqBody.Start(b)
        info = ExtraReqBody.End(b)
    else:
        b.StartObject(0)
        info = b.EndObject()
    ExtraReq.Start(b)
    ExtraReq.AddInfoType(b, kind)
    ExtraReq.AddInfo(b, info)
    b.Finish(ExtraReq.End(b))
    writer.write(frame(RPC_EXTRA_INFO, b.Output()))
    await writer.drain()
    ty, data = await read_frame(reader)
    assert ty == RPC_EXTRA_INFO, ty
    stats["extra_info"] += 1
    resp = ExtraResp.Resp.GetRootAs(data, 0)
    if resp.ResultIsNone():
        return None
    return bytes(resp.Result(i) for i in range(resp.ResultLength()))


def conf_of(token):
    return confs.get(token)


async def on_req_call(reader, writer, data):
    stats["calls"] += 1
    req = HttpReq.Req.GetRootAs(data, 0)
    token = req.ConfToken()
    conf = conf_of(token)
    if conf is None:
        return err(ErrCode.Code.CONF_TOKEN_NOT_FOUND)
    if conf.get("forget") == "1" and conf["_key"] not in forgotten:
        forgotten.add(conf["_key"])
        del confs[token]
        return err(ErrCode.Code.CONF_TOKEN_NOT_FOUND)
    rid = req.Id()
    mode = conf.get("mode", "stop")
    headers = {}
    for i in range(req.HeadersLength()):
        h = req.Headers(i)
        headers[h.Name().decode().lower()] = (h.Value() or b"").decode()
    args = [(req.Args(i).Name().decode(),
             req.Args(i).Value().decode() if req.Args(i).Value() is not None else None)
            for i in range(req.ArgsLength())]
    if mode == "continue":
        return go_on(rid)
    if mode == "stop":
        return stop(rid, int(conf.get("status", "0")),
                    [("X-Runner", "a"), ("X-Runner", "b")],
                    conf.get("body", "").encode())
    if mode == "rewrite":
        return rewrite(
            rid,
            conf.get("path"),
            [("X-Added", "yes"), ("X-Remove", None), ("X-Seen-Path", req.Path().decode())],
            [("added", "1"), ("drop", None), ("multi", "x"), ("multi", "y")],
            [("X-Resp", "r1"), ("X-Resp", "r2"), ("Content-Type", "text/evil")],
            conf.get("body", "").encode(),
        )
    if mode == "var":
        out = []
        for name in conf["vars"].split(","):
            v = await ask(reader, writer, ExtraInfoKind.Info.Var, name)
            out.append("<none>" if v is None else v.decode())
        return stop(rid, 200, [], "|".join(out).encode())
    if mode == "body":
        v = await ask(reader, writer, ExtraInfoKind.Info.ReqBody)
        return stop(rid, 200, [], b"body:" + (v or b""))
    if mode == "stats":
        body = {"pid": os.getpid(), "path": req.Path().decode(), "args": args,
                "method": req.Method(), "src_ip": list(req.SrcIp(i) for i in range(req.SrcIpLength())),
                "host": headers.get("host"), **stats}
        return stop(rid, 200, [], json.dumps(body).encode())
    if mode == "garbage":
        return frame(RPC_HTTP_REQ_CALL, b"\xff\xff\xff\x7f\x01\x02")
    if mode == "badtype":
        return frame(9, b"")
    if mode == "slow":
        await asyncio.sleep(float(conf.get("delay", "5")))
        return stop(rid, 200, [], b"late")
    if mode == "die":
        log("dying mid-request")
        os._exit(3)
    return stop(rid, 500, [], b"unknown mode")


def read_resp_call(data):
    """HTTPRespCall.Req: id, status, headers, conf_token (fields 0-3)."""
    root = N.UOffsetTFlags.py_type(flatbuffers.encode.Get(N.UOffsetTFlags.packer_type, data, 0))
    t = Table(bytearray(data), root)

    def scalar(slot, flags, default):
        o = t.Offset(4 + 2 * slot)
        return t.Get(flags, o + t.Pos) if o else default

    headers = []
    o = t.Offset(8)
    if o:
        start = t.Vector(o)
        for i in range(t.VectorLen(o)):
            e = TextEntry.TextEntry()
            e.Init(t.Bytes, t.Indirect(start + 4 * i))
            headers.append((e.Name().decode(), (e.Value() or b"").decode()))
    return scalar(0, N.Uint32Flags, 0), scalar(1, N.Uint16Flags, 0), headers, scalar(3, N.Uint32Flags, 0)


async def on_resp_call(reader, writer, data):
    stats["calls"] += 1
    rid, status, headers, token = read_resp_call(data)
    conf = conf_of(token)
    if conf is None:
        return err(ErrCode.Code.CONF_TOKEN_NOT_FOUND)
    mode = conf.get("mode")
    b = flatbuffers.Builder(0)
    if mode == "resp_garbage":
        return frame(RPC_HTTP_RESP_CALL, b"\xff\xff\xff\x7f\x01\x02")
    if mode == "resp_status":
        b.StartObject(4)
        b.PrependUint32Slot(0, rid, 0)
        b.PrependUint16Slot(1, int(conf.get("status", "0")), 0)
    elif mode == "resp_req":
        req_body = await ask(reader, writer, ExtraInfoKind.Info.ReqBody) or b""
        uri = await ask(reader, writer, ExtraInfoKind.Info.Var, "uri") or b""
        bv = b.CreateByteVector(b"req:" + req_body + b"|uri:" + uri + b"|upstream:" + str(status).encode())
        b.StartObject(4)
        b.PrependUint32Slot(0, rid, 0)
        b.PrependUOffsetTRelativeSlot(3, bv, 0)
    elif mode == "resp":
        body = await ask(reader, writer, INFO_RESP_BODY) or b""
        hv = text_entries(b, [("X-Post-Resp", "yes"), ("X-Upstream-Status", str(status)),
                              ("Content-Type", "text/plain")])
        bv = b.CreateByteVector(body.upper())
        b.StartObject(4)
        b.PrependUint32Slot(0, rid, 0)
        b.PrependUint16Slot(1, int(conf.get("status", "0")), 0)
        b.PrependUOffsetTRelativeSlot(2, hv, 0)
        b.PrependUOffsetTRelativeSlot(3, bv, 0)
    else:
        b.StartObject(4)
        b.PrependUint32Slot(0, rid, 0)
    b.Finish(b.EndObject())
    return frame(RPC_HTTP_RESP_CALL, b.Output())


def on_prepare(data):
    stats["prepares"] += 1
    req = PrepReq.Req.GetRootAs(data, 0)
    conf = {"_key": req.Key().decode()}
    for i in range(req.ConfLength()):
        e = req.Conf(i)
        conf[e.Name().decode()] = e.Value().decode()
    token = next_token[0]
    next_token[0] += 1
    confs[token] = conf
    b = flatbuffers.Builder(0)
    PrepResp.Start(b)
    PrepResp.AddConfToken(b, token)
    b.Finish(PrepResp.End(b))
    return frame(RPC_PREPARE_CONF, b.Output())


async def serve(reader, writer):
    try:
        while True:
            ty, data = await read_frame(reader)
            if ty == RPC_PREPARE_CONF:
                out = on_prepare(data)
            elif ty == RPC_HTTP_REQ_CALL:
                out = await on_req_call(reader, writer, data)
            elif ty == RPC_HTTP_RESP_CALL:
                out = await on_resp_call(reader, writer, data)
            else:
                out = err(ErrCode.Code.BAD_REQUEST)
            writer.write(out)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    addr = os.environ["APISIX_LISTEN_ADDRESS"]
    assert addr.startswith("unix:"), addr
    path = addr[len("unix:"):]
    if os.path.exists(path):
        os.remove(path)
    server = await asyncio.start_unix_server(serve, path=path)
    log("listening on", addr, "conf expire time", os.environ.get("APISIX_CONF_EXPIRE_TIME"),
        "pid", os.getpid())
    parent = os.getppid()

    async def orphaned():
        # A gateway killed with SIGKILL cannot stop its runner: go with it.
        while os.getppid() == parent:
            await asyncio.sleep(0.2)
        log("the gateway is gone; exiting")
        os._exit(0)

    asyncio.get_running_loop().create_task(orphaned())
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
