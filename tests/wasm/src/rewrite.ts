// Header and body rewriting both ways (APISIX's t/wasm/request-body and response-rewrite):
// request headers set and removed, the request body read (and logged) and replaced, response
// headers set and the response body replaced once it is complete.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, FilterDataStatusValues,
  log, LogLevelValues, stream_context, set_property, get_buffer_bytes, BufferTypeValues,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { parse, JValue } from "./json";

// proxy_set_buffer_bytes as the ABI defines it (the runtime binds no function to it).
// @ts-ignore: decorator
@external("env", "proxy_set_buffer_bytes")
declare function proxy_set_buffer_bytes(typ: u32, start: u32, length: u32, data: usize, size: usize): u32;

function setBuffer(typ: u32, size: usize, text: string): void {
  let data = String.UTF8.encode(text);
  proxy_set_buffer_bytes(typ, 0, <u32>size, changetype<usize>(data), data.byteLength);
}

class Header {
  name: string = "";
  value: string = "";
}

function headers(v: JValue): Array<Header> {
  let out = new Array<Header>();
  for (let i = 0; i < v.items.length; i++) {
    let h = new Header();
    h.name = v.items[i].getString("name");
    h.value = v.items[i].getString("value");
    out.push(h);
  }
  return out;
}

class RewriteRoot extends RootContext {
  conf: string = "";
  reqHeaders: Array<Header> = new Array<Header>();
  removeHeaders: Array<string> = new Array<string>();
  respHeaders: Array<Header> = new Array<Header>();
  reqBody: string = "";
  hasReqBody: bool = false;
  respBody: string = "";
  hasRespBody: bool = false;
  logBody: bool = false;

  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    let parsed = parse(this.conf);
    if (parsed == null) {
      log(LogLevelValues.error, "error decoding plugin configuration");
      return false;
    }
    let v = parsed!;
    this.reqHeaders = headers(v.get("req_headers"));
    this.respHeaders = headers(v.get("headers"));
    let remove = v.get("remove_req_headers");
    for (let i = 0; i < remove.items.length; i++) this.removeHeaders.push(remove.items[i].str);
    this.hasReqBody = v.has("req_body");
    this.reqBody = v.getString("req_body");
    this.hasRespBody = v.has("body");
    this.respBody = v.getString("body");
    this.logBody = v.get("processReqBody").flag;
    return true;
  }

  createContext(context_id: u32): Context {
    return new RewriteHttp(context_id, this);
  }
}

class RewriteHttp extends Context {
  constructor(context_id: u32, root: RewriteRoot) {
    super(context_id, root);
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let root = this.root_context as RewriteRoot;
    for (let i = 0; i < root.reqHeaders.length; i++) {
      stream_context.headers.request.replace(root.reqHeaders[i].name, root.reqHeaders[i].value);
    }
    for (let i = 0; i < root.removeHeaders.length; i++) {
      stream_context.headers.request.remove(root.removeHeaders[i]);
    }
    if (root.hasReqBody || root.logBody) {
      set_property("wasm_process_req_body", String.UTF8.encode("true"));
    }
    return FilterHeadersStatusValues.Continue;
  }

  onRequestBody(size: usize, end_of_stream: bool): FilterDataStatusValues {
    let root = this.root_context as RewriteRoot;
    let body = String.UTF8.decode(get_buffer_bytes(BufferTypeValues.HttpRequestBody, 0, <u32>size));
    log(LogLevelValues.warn, "request get body: " + body);
    if (root.hasReqBody) {
      setBuffer(BufferTypeValues.HttpRequestBody, size, root.reqBody);
    }
    return FilterDataStatusValues.Continue;
  }

  onResponseHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let root = this.root_context as RewriteRoot;
    for (let i = 0; i < root.respHeaders.length; i++) {
      stream_context.headers.response.replace(root.respHeaders[i].name, root.respHeaders[i].value);
    }
    if (root.hasRespBody) {
      set_property("wasm_process_resp_body", String.UTF8.encode("true"));
    }
    return FilterHeadersStatusValues.Continue;
  }

  onResponseBody(size: usize, end_of_stream: bool): FilterDataStatusValues {
    let root = this.root_context as RewriteRoot;
    if (!end_of_stream) {
      // Held until the body is complete.
      return FilterDataStatusValues.StopIterationAndBuffer;
    }
    setBuffer(BufferTypeValues.HttpResponseBody, size, root.respBody);
    return FilterDataStatusValues.Continue;
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new RewriteRoot(context_id);
}, "");
