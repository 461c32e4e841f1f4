// A plugin that does nothing but take part: a root context per conf and an HTTP context per
// request whose request-headers call-in continues at once. benches/e2e/bench.py's wasm-noop
// scenario measures what a wasm plugin costs a request before it does any work.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues,
} from "@solo-io/proxy-runtime/runtime";

class NoopRoot extends RootContext {
  onConfigure(size: u32): bool {
    return true;
  }

  createContext(context_id: u32): Context {
    return new NoopHttp(context_id, this);
  }
}

class NoopHttp extends Context {
  constructor(context_id: u32, root: NoopRoot) {
    super(context_id, root);
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    return FilterHeadersStatusValues.Continue;
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new NoopRoot(context_id);
}, "");
