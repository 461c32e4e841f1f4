// exit-transformer's function over a plugin's exit: an answer of 401 (key-auth's
// `{"message":"Missing API key in request"}`, say) goes out as a 403 with the conf's body.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, FilterDataStatusValues,
  stream_context, set_property, BufferTypeValues,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { parse } from "./json";

// @ts-ignore: decorator
@external("env", "proxy_set_buffer_bytes")
declare function proxy_set_buffer_bytes(typ: u32, start: u32, length: u32, data: usize, size: usize): u32;

class ExitRoot extends RootContext {
  body: string = "";

  onConfigure(size: u32): bool {
    let v = parse(readConfiguration(size));
    if (v == null) return false;
    this.body = v!.getString("body");
    return true;
  }

  createContext(context_id: u32): Context {
    return new Exit(context_id, this);
  }
}

class Exit extends Context {
  onResponseHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    if (stream_context.headers.response.get(":status") == "401") {
      stream_context.headers.response.replace(":status", "403");
      stream_context.headers.response.remove("content-length");
      set_property("wasm_process_resp_body", String.UTF8.encode("true"));
    }
    return FilterHeadersStatusValues.Continue;
  }

  onResponseBody(size: usize, end_of_stream: bool): FilterDataStatusValues {
    if (!end_of_stream) return FilterDataStatusValues.StopIterationAndBuffer;
    let data = String.UTF8.encode((this.root_context as ExitRoot).body);
    proxy_set_buffer_bytes(BufferTypeValues.HttpResponseBody, 0, <u32>size,
      changetype<usize>(data), data.byteLength);
    return FilterDataStatusValues.Continue;
  }
}

registerRootContext((id: u32): RootContext => new ExitRoot(id), "");
