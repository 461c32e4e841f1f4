// APISIX's t/wasm/forward-auth.go: asks an authorization service about each request through
// proxy_http_call; its headers named in upstream_headers go upstream, and an answer of 300 or
// more denies the request with 403 and the headers named in client_headers.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, log, LogLevelValues,
  send_local_response, GrpcStatusValues, Headers, HeaderPair, stream_context, get_property,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { parse, JValue } from "./json";

function names(v: JValue, lower: bool): Array<string> {
  let out = new Array<string>();
  for (let i = 0; i < v.items.length; i++) {
    // Not `lower ? s.toLowerCase() : s`: AssemblyScript 0.14's reference counting releases
    // the borrowed branch of such a conditional as if it were the fresh one, which freed the
    // conf's strings while they were still held here.
    let s = v.items[i].str;
    if (lower) {
      out.push(s.toLowerCase());
    } else {
      out.push(s);
    }
  }
  return out;
}

function pair(k: string, v: string): HeaderPair {
  return new HeaderPair(String.UTF8.encode(k), String.UTF8.encode(v));
}

class AuthRoot extends RootContext {
  conf: string = "";
  host: string = "";
  path: string = "/";
  scheme: string = "http";
  timeout: u32 = 3000;
  upstreamHeaders: Array<string> = new Array<string>();
  clientHeaders: Array<string> = new Array<string>();
  requestHeaders: Array<string> = new Array<string>();

  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    let parsed = parse(this.conf);
    if (parsed == null) {
      log(LogLevelValues.error, "error decoding plugin configuration");
      return false;
    }
    let v = parsed!;
    let timeout = v.getInt("timeout", 3000);
    if (timeout < 1 || timeout > 60000) {
      log(LogLevelValues.error, "bad timeout");
      return false;
    }
    this.timeout = <u32>timeout;
    let uri = v.getString("uri");
    let sep = uri.indexOf("://");
    if (uri == "" || sep < 0) {
      log(LogLevelValues.error, "bad uri");
      return false;
    }
    this.scheme = uri.substring(0, sep);
    let rest = uri.substring(sep + 3);
    let slash = rest.indexOf("/");
    if (slash < 0) {
      this.host = rest;
    } else {
      this.host = rest.substring(0, slash);
      this.path = rest.substring(slash);
    }
    this.upstreamHeaders = names(v.get("upstream_headers"), true);
    this.clientHeaders = names(v.get("client_headers"), true);
    this.requestHeaders = names(v.get("request_headers"), false);
    return true;
  }

  createContext(context_id: u32): Context {
    return new AuthHttp(context_id, this);
  }
}

class AuthHttp extends Context {
  constructor(context_id: u32, root: AuthRoot) {
    super(context_id, root);
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let root = this.root_context as AuthRoot;
    let req = stream_context.headers.request;
    let hs: Headers = [];
    hs.push(pair(":scheme", root.scheme));
    hs.push(pair("host", root.host));
    hs.push(pair(":path", root.path));
    hs.push(pair("X-Forwarded-Proto", req.get(":scheme")));
    hs.push(pair("X-Forwarded-Method", req.get(":method")));
    hs.push(pair("X-Forwarded-Host", req.get("host")));
    hs.push(pair("X-Forwarded-Uri", req.get(":path")));
    hs.push(pair("X-Forwarded-For", String.UTF8.decode(get_property("remote_addr"))));
    for (let i = 0; i < root.requestHeaders.length; i++) {
      let k = root.requestHeaders[i];
      hs.push(pair(k, req.get(k)));
    }
    let trailers: Headers = [];
    root.httpCall(root.host, hs, new ArrayBuffer(0), trailers, root.timeout, this, authorized);
    return FilterHeadersStatusValues.Continue;
  }
}

function authorized(origin: Context, headers: u32, body_size: usize, trailers: u32): void {
  let root = origin.root_context as AuthRoot;
  let hs = stream_context.headers.http_callback.get_headers();
  let status = 0;
  for (let i = 0; i < hs.length; i++) {
    let k = String.UTF8.decode(hs[i].key);
    let v = String.UTF8.decode(hs[i].value);
    if (k == ":status") status = I32.parseInt(v);
    if (root.upstreamHeaders.indexOf(k) >= 0) {
      stream_context.headers.request.replace(k, v);
    }
  }
  if (status >= 300 || status == 0) {
    let chs: Headers = [];
    for (let i = 0; i < hs.length; i++) {
      let k = String.UTF8.decode(hs[i].key);
      if (root.clientHeaders.indexOf(k) >= 0) chs.push(hs[i]);
    }
    send_local_response(403, "", new ArrayBuffer(0), chs, GrpcStatusValues.Unknown);
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new AuthRoot(context_id);
}, "");
