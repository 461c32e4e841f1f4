// serverless-post-function's function in the log phase: one line per request with its
// method, path and status.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context, log,
  LogLevelValues,
} from "@solo-io/proxy-runtime/runtime";

class Post extends Context {
  method: string = "";
  path: string = "";
  status: string = "";

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    this.method = stream_context.headers.request.get(":method");
    this.path = stream_context.headers.request.get(":path");
    return FilterHeadersStatusValues.Continue;
  }

  onResponseHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    this.status = stream_context.headers.response.get(":status");
    return FilterHeadersStatusValues.Continue;
  }

  onLog(): void {
    log(LogLevelValues.warn, "served " + this.method + " " + this.path + " " + this.status);
  }
}

class PostRoot extends RootContext {
  onConfigure(size: u32): bool {
    return true;
  }
  createContext(context_id: u32): Context {
    return new Post(context_id, this);
  }
}

registerRootContext((id: u32): RootContext => new PostRoot(id), "");
