// inspect's breakpoint, put where the code is: when a request matches the conf's `path`, log
// what the gateway sees of it at that point (a header and a property).
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, stream_context, log,
  LogLevelValues, get_property,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { parse } from "./json";

class InspectRoot extends RootContext {
  path: string = "";

  onConfigure(size: u32): bool {
    let v = parse(readConfiguration(size));
    if (v == null) return false;
    this.path = v!.getString("path");
    return true;
  }

  createContext(context_id: u32): Context {
    return new Inspect(context_id, this);
  }
}

class Inspect extends Context {
  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let path = stream_context.headers.request.get(":path");
    if (path == (this.root_context as InspectRoot).path) {
      let addr = String.UTF8.decode(get_property("remote_addr"));
      log(LogLevelValues.warn, "inspect " + path + ": from " + addr + ", user-agent " +
        stream_context.headers.request.get("user-agent"));
    }
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((id: u32): RootContext => new InspectRoot(id), "");
