// Shared data, shared queues and tick timers: every request counts itself in the shared data
// (compare-and-swap) and queues an event; the queue's owner counts the events it dequeues; a
// 20ms tick counts ticks. The request is answered with the three counts.
export * from "@solo-io/proxy-runtime/proxy";
import {
  RootContext, Context, registerRootContext, FilterHeadersStatusValues, send_local_response,
  GrpcStatusValues, Headers, set_tick_period_milliseconds, log, LogLevelValues,
} from "@solo-io/proxy-runtime/runtime";
import { readConfiguration } from "./conf";

// The shared-data and queue calls as the ABI defines them (the runtime's bindings of these
// pass the wrong pointers).
// @ts-ignore: decorator
@external("env", "proxy_get_shared_data")
declare function proxy_get_shared_data(kp: usize, kl: usize, vpp: usize, vlp: usize, casp: usize): u32;
// @ts-ignore: decorator
@external("env", "proxy_set_shared_data")
declare function proxy_set_shared_data(kp: usize, kl: usize, vp: usize, vl: usize, cas: u32): u32;
// @ts-ignore: decorator
@external("env", "proxy_register_shared_queue")
declare function proxy_register_shared_queue(np: usize, nl: usize, tokenp: usize): u32;
// @ts-ignore: decorator
@external("env", "proxy_enqueue_shared_queue")
declare function proxy_enqueue_shared_queue(token: u32, dp: usize, dl: usize): u32;
// @ts-ignore: decorator
@external("env", "proxy_dequeue_shared_queue")
declare function proxy_dequeue_shared_queue(token: u32, dpp: usize, dlp: usize): u32;

const slots = new ArrayBuffer(16);

// The counter `key` plus one, retried until the compare-and-swap holds.
function bump(key: string): u32 {
  let k = String.UTF8.encode(key);
  let at = changetype<usize>(slots);
  for (let tries = 0; tries < 100; tries++) {
    let n: u32 = 0;
    let cas: u32 = 0;
    if (proxy_get_shared_data(changetype<usize>(k), k.byteLength, at, at + 4, at + 8) == 0) {
      cas = load<u32>(at + 8);
      if (load<u32>(at + 4) == 4) n = load<u32>(<usize>load<u32>(at));
    }
    let v = new ArrayBuffer(4);
    store<u32>(changetype<usize>(v), n + 1);
    if (proxy_set_shared_data(changetype<usize>(k), k.byteLength, changetype<usize>(v), 4, cas) == 0) {
      return n + 1;
    }
  }
  return 0;
}

function read(key: string): u32 {
  let k = String.UTF8.encode(key);
  let at = changetype<usize>(slots);
  if (proxy_get_shared_data(changetype<usize>(k), k.byteLength, at, at + 4, at + 8) != 0) return 0;
  if (load<u32>(at + 4) != 4) return 0;
  return load<u32>(<usize>load<u32>(at));
}

let queue: u32 = 0;

class StateRoot extends RootContext {
  conf: string = "";
  onConfigure(size: u32): bool {
    this.conf = readConfiguration(size);
    let name = String.UTF8.encode("events");
    let at = changetype<usize>(slots);
    if (proxy_register_shared_queue(changetype<usize>(name), name.byteLength, at) != 0) {
      log(LogLevelValues.error, "cannot register the queue");
      return false;
    }
    queue = load<u32>(at);
    set_tick_period_milliseconds(20);
    return true;
  }

  onTick(): void {
    bump("ticks");
  }

  onQueueReady(token: u32): void {
    let at = changetype<usize>(slots);
    while (proxy_dequeue_shared_queue(token, at, at + 4) == 0) {
      bump("dequeued");
    }
  }

  createContext(context_id: u32): Context {
    return new StateHttp(context_id, this);
  }
}

class StateHttp extends Context {
  constructor(context_id: u32, root: StateRoot) {
    super(context_id, root);
  }

  onRequestHeaders(n: u32, end_of_stream: bool): FilterHeadersStatusValues {
    let hits = bump("hits");
    let event = String.UTF8.encode("hit");
    proxy_enqueue_shared_queue(queue, changetype<usize>(event), event.byteLength);
    let body = "hits=" + hits.toString() + " dequeued=" + read("dequeued").toString() +
      " ticks=" + read("ticks").toString();
    let headers: Headers = [];
    send_local_response(200, "", String.UTF8.encode(body), headers, GrpcStatusValues.Unknown);
    return FilterHeadersStatusValues.StopIteration;
  }
}

registerRootContext((context_id: u32): RootContext => {
  return new StateRoot(context_id);
}, "");
