// APISIX's t/wasm/log: logs the plugin context, its conf and the HTTP context of each request,
// and what the request looks like through the host calls (a property and a header).
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, log, LogLevelValues,
  get_property, stream_context,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";

class LogRoot extends RootContext {
  conf: string = "";

  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    return true;
  }

  createContext(context_id: u32): Context {
    return new LogHttp(context_id, this);
  }

  onDone(): bool {
    log(LogLevelValues.info, "do clean up...");
    return true;
  }
}

class LogHttp extends Context {
  logRoot: LogRoot;

  constructor(context_id: u32, root: LogRoot) {
    super(context_id, root);
    this.logRoot = root;
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let root = this.logRoot;
    log(LogLevelValues.warn, "run plugin ctx " + root.context_id.toString() + " with conf " +
      root.conf + " in http ctx " + this.context_id.toString());
    let addr = String.UTF8.decode(get_property("remote_addr"));
    let test = stream_context.headers.request.get("x-test");
    let method = stream_context.headers.request.get(":method");
    log(LogLevelValues.warn, "request " + method + " from " + addr + " with x-test " + test);
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new LogRoot(context_id);
}, "");
