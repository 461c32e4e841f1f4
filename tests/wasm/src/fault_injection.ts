// APISIX's t/wasm/fault-injection: answers the request itself with the configured status and
// body, for a share of the requests.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, log, LogLevelValues,
  send_local_response, GrpcStatusValues, Headers,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";
import { get_current_time_nanoseconds } from "@solo-io/proxy-runtime/runtime";
import { parse } from "./json";

class FaultRoot extends RootContext {
  conf: string = "";
  body: string = "";
  status: i32 = 0;
  percentage: i32 = 100;

  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    let v = parse(this.conf);
    if (v == null) {
      log(LogLevelValues.error, "error decoding plugin configuration");
      return false;
    }
    let conf = v!;
    this.body = conf.getString("body");
    this.status = conf.getInt("http_status", 0);
    this.percentage = conf.getInt("percentage", 100);
    if (this.status < 200) {
      log(LogLevelValues.error, "bad http_status");
      return false;
    }
    if (this.percentage < 0 || this.percentage > 100) {
      log(LogLevelValues.error, "bad percentage");
      return false;
    }
    return true;
  }

  createContext(context_id: u32): Context {
    return new FaultHttp(context_id, this);
  }
}

class FaultHttp extends Context {
  constructor(context_id: u32, root: FaultRoot) {
    super(context_id, root);
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let root = this.root_context as FaultRoot;
    if (<i32>(get_current_time_nanoseconds() % 100) >= root.percentage) {
      return FilterHeadersStatusValues.Continue;
    }
    let headers: Headers = [];
    send_local_response(<u32>root.status, "", String.UTF8.encode(root.body), headers,
      GrpcStatusValues.Unknown);
    return FilterHeadersStatusValues.StopIteration;
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new FaultRoot(context_id);
}, "");
