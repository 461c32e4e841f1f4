// serverless-pre-function's `return function(conf, ctx) ... end` in the rewrite phase: here a
// request without `x-api-version` gets one, and one asking for `v0` is refused.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context,
  send_local_response, GrpcStatusValues, Headers,
} from "@solo-io/proxy-runtime/runtime";

class Pre extends Context {
  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let version = stream_context.headers.request.get("x-api-version");
    if (version == "v0") {
      let headers: Headers = [];
      send_local_response(410, "", String.UTF8.encode("v0 is gone\n"), headers,
        GrpcStatusValues.Unknown);
      return FilterHeadersStatusValues.StopIteration;
    }
    if (version == "") {
      stream_context.headers.request.replace("x-api-version", "v2");
    }
    return FilterHeadersStatusValues.Continue;
  }
}

class PreRoot extends RootContext {
  onConfigure(size: u32): bool {
    return true;
  }
  createContext(context_id: u32): Context {
    return new Pre(context_id, this);
  }
}

registerRootContext((id: u32): RootContext => new PreRoot(id), "");
