//! One instance of a plugin's module per worker thread (its proxy-wasm "VM"), the root contexts
//! made in it (one per configured conf), and the call-ins into it.
//!
//! A worker's requests never leave its thread, so its instance lives in a thread-local map,
//! as the upstream keep-alive pool does: the request path takes no lock to reach it, and a
//! worker's requests (which interleave at their awaits) share it as nginx's do the module of
//! their worker. Every call-in runs under the epoch deadline and the memory limit; a trap
//! (the module's own, the deadline, memory refused) discards the instance, and the next
//! request on that worker makes a fresh one from the module compiled at boot.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use wasmtime::{Engine, Error, InstancePre, Store, StoreLimitsBuilder, TypedFunc};

use crate::host::{self, Call, HostState};
use crate::shared::Shared;

/// A plugin's module, compiled and linked once at boot.
pub(crate) struct Loaded {
    pub name: Arc<str>,
    pub uid: u64,
    pub engine: Engine,
    pub pre: InstancePre<HostState>,
    pub shared: Arc<Shared>,
    pub max_memory: usize,
    /// Epoch ticks one call-in may run.
    pub deadline_ticks: u64,
    pub next_root: AtomicU64,
    /// Root keys by the conf's state key, so an unchanged conf keeps its root contexts across
    /// recompiles (a changed one gets new ones, as APISIX's plugin_ctxs on a new conf table).
    pub roots: std::sync::Mutex<HashMap<String, Weak<RootKey>>>,
    /// `http_request_phase: rewrite`.
    pub rewrite: bool,
}

/// One configured conf: its root contexts (one per worker) live while it does.
pub(crate) struct RootKey {
    pub id: u64,
    pub conf: Bytes,
}

/// `proxy_on_http_call_response(context, token, headers, body size, trailers)`.
type HttpCallResponse = TypedFunc<(u32, u32, u32, u32, u32), ()>;

struct Exports {
    context_create: Option<TypedFunc<(u32, u32), ()>>,
    vm_start: Option<TypedFunc<(u32, u32), u32>>,
    configure: Option<TypedFunc<(u32, u32), u32>>,
    request_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    request_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    response_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    response_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    http_call_response: Option<HttpCallResponse>,
    tick: Option<TypedFunc<u32, ()>>,
    queue_ready: Option<TypedFunc<(u32, u32), ()>>,
    done: Option<TypedFunc<u32, u32>>,
    log: Option<TypedFunc<u32, ()>>,
    delete: Option<TypedFunc<u32, ()>>,
}

/// A root context in this instance: `None` when its `proxy_on_configure` refused the conf.
struct Root {
    ctx: Option<u32>,
    key: Weak<RootKey>,
}

/// A plugin's instance on one worker.
pub(crate) struct WorkerVm {
    /// Tells this instance from a later one on the same worker (request guards and timers
    /// carry it, so a context of a discarded instance is never confused with a new one's).
    pub id: u64,
    store: Store<HostState>,
    f: Exports,
    roots: HashMap<u64, Root>,
    next_ctx: u32,
    deadline_ticks: u64,
    /// Queue tokens registered by a root context of this instance.
    queue_owner: HashMap<u32, u32>,
}

thread_local! {
    static VMS: RefCell<HashMap<u64, WorkerVm>> = RefCell::new(HashMap::new());
}

/// Distinct instance ids (only the numbering is process-wide).
static NEXT_VM: AtomicU64 = AtomicU64::new(1);

/// Why a call failed, in one line: the trap or the refusal at its root (the wasm backtrace
/// around it spans many lines).
pub(crate) fn describe(e: &Error) -> String {
    e.root_cause().to_string()
}

/// A fresh id for an instance or a loaded module (keys of the thread-local map).
pub(crate) fn next_id() -> u64 {
    NEXT_VM.fetch_add(1, Ordering::Relaxed)
}

/// What a call-in left for the caller to do: timers to start.
pub(crate) type Ticks = Vec<(u32, u32)>;

impl Loaded {
    fn instantiate(&self) -> Result<WorkerVm, Error> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.max_memory)
            .instances(1)
            .trap_on_grow_failure(true)
            .build();
        let mut store = Store::new(
            &self.engine,
            HostState::new(self.name.clone(), self.shared.clone(), limits),
        );
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.deadline_ticks);
        let instance = self.pre.instantiate(&mut store)?;
        let memory = instance.get_memory(&mut store, "memory");
        let malloc = host::export::<u32, u32>(&mut store, &instance, "proxy_on_memory_allocate")
            .or_else(|| host::export(&mut store, &instance, "malloc"));
        store.data_mut().memory = memory;
        store.data_mut().malloc = malloc;
        let f = Exports {
            context_create: host::export(&mut store, &instance, "proxy_on_context_create"),
            vm_start: host::export(&mut store, &instance, "proxy_on_vm_start"),
            configure: host::export(&mut store, &instance, "proxy_on_configure"),
            request_headers: host::export(&mut store, &instance, "proxy_on_request_headers"),
            request_body: host::export(&mut store, &instance, "proxy_on_request_body"),
            response_headers: host::export(&mut store, &instance, "proxy_on_response_headers"),
            response_body: host::export(&mut store, &instance, "proxy_on_response_body"),
            http_call_response: host::export(&mut store, &instance, "proxy_on_http_call_response"),
            tick: host::export(&mut store, &instance, "proxy_on_tick"),
            queue_ready: host::export(&mut store, &instance, "proxy_on_queue_ready"),
            done: host::export(&mut store, &instance, "proxy_on_done"),
            log: host::export(&mut store, &instance, "proxy_on_log"),
            delete: host::export(&mut store, &instance, "proxy_on_delete"),
        };
        // WASI reactors (TinyGo) initialise here; command modules run their main.
        let init = host::export::<(), ()>(&mut store, &instance, "_initialize")
            .or_else(|| host::export(&mut store, &instance, "_start"));
        if let Some(init) = init {
            init.call(&mut store, ())?;
        }
        let mut vm = WorkerVm {
            id: next_id(),
            store,
            f,
            roots: HashMap::new(),
            next_ctx: 2,
            deadline_ticks: self.deadline_ticks,
            queue_owner: HashMap::new(),
        };
        // The VM's own root context (1), which `proxy_on_vm_start` runs in.
        if let Some(create) = vm.f.context_create.clone() {
            vm.call(create, (1, 0))?;
        }
        if let Some(start) = vm.f.vm_start.clone() {
            if vm.call(start, (1, 0))? == 0 {
                return Err(Error::msg("proxy_on_vm_start failed"));
            }
        }
        Ok(vm)
    }
}

/// Runs `f` on this worker's instance of `loaded`, made first if there is none. A call-in
/// that failed (`Err` from `f`) discards the instance.
pub(crate) fn with_vm<R>(
    loaded: &Loaded,
    f: impl FnOnce(&mut WorkerVm) -> Result<R, Error>,
) -> Result<R, Error> {
    VMS.with(|vms| {
        let Ok(mut vms) = vms.try_borrow_mut() else {
            return Err(Error::msg("wasm instance busy"));
        };
        let vm = match vms.entry(loaded.uid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(loaded.instantiate()?),
        };
        let out = f(vm);
        if out.is_err() {
            vms.remove(&loaded.uid);
        }
        out
    })
}

/// Runs `f` on this worker's instance of `loaded` when it is still instance `vm_id`; `None`
/// otherwise (discarded since, or another thread).
pub(crate) fn with_same_vm<R>(
    uid: u64,
    vm_id: u64,
    f: impl FnOnce(&mut WorkerVm) -> Result<R, Error>,
) -> Option<Result<R, Error>> {
    VMS.try_with(|vms| {
        let mut vms = vms.try_borrow_mut().ok()?;
        let vm = vms.get_mut(&uid).filter(|vm| vm.id == vm_id)?;
        let out = f(vm);
        if out.is_err() {
            vms.remove(&uid);
        }
        Some(out)
    })
    .ok()
    .flatten()
}

/// The outcome of a root context's configuration on this worker.
pub(crate) enum Configured {
    Ready(u32, Ticks),
    Refused,
}

impl WorkerVm {
    fn call<P, R>(&mut self, f: TypedFunc<P, R>, params: P) -> Result<R, Error>
    where
        P: wasmtime::WasmParams,
        R: wasmtime::WasmResults,
    {
        self.store.set_epoch_deadline(self.deadline_ticks);
        let out = f.call(&mut self.store, params);
        self.after_call()?;
        out
    }

    /// Queues registered during the call belong to the context that was effective (a root
    /// context, in the SDKs); queues that got items during it: their owners hear of it.
    fn after_call(&mut self) -> Result<(), Error> {
        if !self.store.data().registered.is_empty() {
            let owner = self.store.data().effective;
            for token in std::mem::take(&mut self.store.data_mut().registered) {
                self.queue_owner.insert(token, owner);
            }
        }
        if self.store.data().queue_ready.is_empty() {
            return Ok(());
        }
        let ready = std::mem::take(&mut self.store.data_mut().queue_ready);
        let Some(f) = self.f.queue_ready.clone() else {
            return Ok(());
        };
        for token in ready {
            if let Some(&root) = self.queue_owner.get(&token) {
                self.store.set_epoch_deadline(self.deadline_ticks);
                f.call(&mut self.store, (root, token))?;
            }
        }
        Ok(())
    }

    fn new_ctx(&mut self) -> u32 {
        let id = self.next_ctx;
        self.next_ctx = self.next_ctx.wrapping_add(1).max(2);
        id
    }

    /// The root context of `key` on this worker, configured on first use.
    pub(crate) fn root(&mut self, key: &Arc<RootKey>) -> Result<Configured, Error> {
        if let Some(root) = self.roots.get(&key.id) {
            return Ok(match root.ctx {
                Some(ctx) => Configured::Ready(ctx, Vec::new()),
                None => Configured::Refused,
            });
        }
        self.release_dead_roots()?;
        let ctx = self.new_ctx();
        self.store.data_mut().effective = ctx;
        if let Some(create) = self.f.context_create.clone() {
            self.call(create, (ctx, 0))?;
        }
        self.store.data_mut().conf = key.conf.clone();
        let ok = match self.f.configure.clone() {
            Some(configure) => self.call(configure, (ctx, key.conf.len() as u32))? != 0,
            None => true,
        };
        let ticks = std::mem::take(&mut self.store.data_mut().ticks);
        self.roots.insert(
            key.id,
            Root {
                ctx: ok.then_some(ctx),
                key: Arc::downgrade(key),
            },
        );
        Ok(if ok {
            Configured::Ready(ctx, ticks)
        } else {
            Configured::Refused
        })
    }

    /// Root contexts whose conf is gone from the configuration end (`proxy_on_done`,
    /// `proxy_on_delete`).
    fn release_dead_roots(&mut self) -> Result<(), Error> {
        let dead: Vec<u64> = self
            .roots
            .iter()
            .filter(|(_, r)| r.key.strong_count() == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            if let Some(Root { ctx: Some(ctx), .. }) = self.roots.remove(&id) {
                self.queue_owner.retain(|_, owner| *owner != ctx);
                self.finish(ctx, false)?;
            }
        }
        Ok(())
    }

    /// Whether the root context `ctx` still belongs to a live conf.
    pub(crate) fn root_alive(&self, ctx: u32) -> bool {
        // 1: the VM's own root context, alive as long as the instance.
        ctx == 1
            || self
                .roots
                .values()
                .any(|r| r.ctx == Some(ctx) && r.key.strong_count() > 0)
    }

    /// A new HTTP context under root context `root`.
    pub(crate) fn http_ctx(&mut self, root: u32) -> Result<u32, Error> {
        let ctx = self.new_ctx();
        if let Some(create) = self.f.context_create.clone() {
            self.call(create, (ctx, root))?;
        }
        Ok(ctx)
    }

    /// Moves `call` in, runs `f`, and moves it back out (also when the call-in failed, so the
    /// request's headers are never lost).
    fn with_call<R>(
        &mut self,
        call: &mut Call,
        ctx: u32,
        f: impl FnOnce(&mut Self) -> Result<R, Error>,
    ) -> Result<R, Error> {
        std::mem::swap(&mut self.store.data_mut().call, call);
        self.store.data_mut().effective = ctx;
        let out = f(self);
        std::mem::swap(&mut self.store.data_mut().call, call);
        out
    }

    /// `proxy_on_request_headers`; `true` to continue.
    pub(crate) fn request_headers(&mut self, call: &mut Call, ctx: u32) -> Result<bool, Error> {
        let Some(f) = self.f.request_headers.clone() else {
            return Ok(true);
        };
        let n = call.req_headers.len() as u32;
        self.with_call(call, ctx, |vm| vm.call(f, (ctx, n, 0)))
            .map(|a| a as i32 == crate::abi::ACTION_CONTINUE)
    }

    pub(crate) fn request_body(&mut self, call: &mut Call, ctx: u32) -> Result<(), Error> {
        let Some(f) = self.f.request_body.clone() else {
            return Ok(());
        };
        let len = call.req_body.as_ref().map_or(0, Bytes::len) as u32;
        self.with_call(call, ctx, |vm| vm.call(f, (ctx, len, 1)))
            .map(|_| ())
    }

    pub(crate) fn response_headers(&mut self, call: &mut Call, ctx: u32) -> Result<(), Error> {
        let Some(f) = self.f.response_headers.clone() else {
            return Ok(());
        };
        let n = call.resp_headers.len() as u32 + 1;
        self.with_call(call, ctx, |vm| vm.call(f, (ctx, n, 0)))
            .map(|_| ())
    }

    /// `proxy_on_response_body` on `call.resp_body`; `true` when the module lets what it
    /// holds go on (`Continue`), `false` when it buffers for more.
    pub(crate) fn response_body(
        &mut self,
        call: &mut Call,
        ctx: u32,
        end: bool,
    ) -> Result<bool, Error> {
        let Some(f) = self.f.response_body.clone() else {
            return Ok(true);
        };
        let len = call.resp_body.as_ref().map_or(0, Vec::len) as u32;
        self.with_call(call, ctx, |vm| vm.call(f, (ctx, len, u32::from(end))))
            .map(|a| a as i32 == crate::abi::ACTION_CONTINUE)
    }

    /// `proxy_on_http_call_response` in root context `root`, with `call.callout` set.
    pub(crate) fn http_call_response(
        &mut self,
        call: &mut Call,
        ctx: u32,
        root: u32,
        token: u32,
    ) -> Result<(), Error> {
        let Some(f) = self.f.http_call_response.clone() else {
            return Ok(());
        };
        let (n, len) = call
            .callout
            .as_ref()
            .map_or((0, 0), |r| (r.headers.len() as u32, r.body.len() as u32));
        self.with_call(call, ctx, |vm| vm.call(f, (root, token, n, len, 0)))
    }

    /// `proxy_on_tick` of root context `root`.
    pub(crate) fn tick(&mut self, root: u32) -> Result<(), Error> {
        let Some(f) = self.f.tick.clone() else {
            return Ok(());
        };
        self.store.data_mut().effective = root;
        self.call(f, root)
    }

    /// Ends context `ctx`: `proxy_on_done`, then (an HTTP context) `proxy_on_log`, then
    /// `proxy_on_delete`.
    pub(crate) fn finish(&mut self, ctx: u32, http: bool) -> Result<(), Error> {
        self.store.data_mut().effective = ctx;
        if let Some(f) = self.f.done.clone() {
            self.call(f, ctx)?;
        }
        if http {
            if let Some(f) = self.f.log.clone() {
                self.call(f, ctx)?;
            }
        }
        if let Some(f) = self.f.delete.clone() {
            self.call(f, ctx)?;
        }
        Ok(())
    }
}
