// example-plugin, APISIX's sample: its conf (`i` a number, required; `s` a string; `t` an
// array) checked when configured, and logged in the rewrite phase.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, log, LogLevelValues,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { parse } from "./json";

class ExampleRoot extends RootContext {
  conf: string = "";

  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    let v = parse(this.conf);
    // A conf without `i`, or with a negative one, is refused: the route answers 503.
    if (v == null || !v!.has("i") || v!.getInt("i", -1) < 0) {
      log(LogLevelValues.error, "example-plugin: property i is required");
      return false;
    }
    return true;
  }

  createContext(context_id: u32): Context {
    return new Example(context_id, this);
  }
}

class Example extends Context {
  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    log(LogLevelValues.warn, "plugin rewrite phase, conf: " +
      (this.root_context as ExampleRoot).conf);
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((id: u32): RootContext => new ExampleRoot(id), "");
