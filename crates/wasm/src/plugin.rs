//! A wasm plugin's conf on a route, as APISIX's `wasm.lua` runs it: `proxy_on_request_headers`
//! in the access (or rewrite) phase, then `proxy_on_request_body` on the whole body when the
//! module set `wasm_process_req_body`; `proxy_on_response_headers` in `header_filter`, then
//! `proxy_on_response_body` on each chunk of the body when it set `wasm_process_resp_body`.
//! One HTTP context per request and conf, ended (`proxy_on_done`, `proxy_on_log`,
//! `proxy_on_delete`) when the request ends.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrisix_plugin_api::{
    BodyChunk, BodyFilter, Exit, Phases, Plugin, PluginCtx, PluginServices, ResponseHead, Step,
};
use ferrisix_router::VarSource;
use http::{header, HeaderName, HeaderValue, Method, Request, StatusCode};

use crate::host::{Call, CallResponse, LocalResponse, PendingCall};
use crate::vm::{self, Configured, Loaded, RootKey, Ticks};

/// The request variables a module reads as properties (APISIX's wasm-nginx-module answers
/// any nginx variable by name; these are the ones ferrisix collects for each request).
const PROPS: &[&str] = &[
    "remote_addr",
    "remote_port",
    "server_addr",
    "server_port",
    "scheme",
    "host",
    "uri",
    "request_uri",
    "args",
    "request_method",
    "route_id",
    "route_name",
    "service_id",
    "service_name",
    "consumer_name",
];

/// The most of a request body read for `proxy_on_request_body` (APISIX reads it whole).
const BODY_LIMIT: usize = 16 << 20;

/// A call without a timeout of its own waits this long.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct WasmConf {
    pub loaded: Arc<Loaded>,
    pub root: Arc<RootKey>,
    pub services: Arc<PluginServices>,
    pub rewrite: bool,
}

/// Why a call failed, worded as APISIX's `wasm.lua` logs it.
enum Fail {
    Ctx(String),
    Run(String),
}

/// This request's HTTP contexts, one per wasm conf it ran.
#[derive(Default)]
struct WasmRequest(Vec<Option<Entry>>);

struct Entry {
    /// Whose context this is: the module (`Loaded::uid`) and its conf (`RootKey::id`, counted
    /// per module, so two modules' confs on one request share ids).
    key: EntryKey,
    vm_id: u64,
    ctx: u32,
    root_ctx: u32,
    call: Call,
}

/// Ends an HTTP context when its request ends (dropped after the log phase, on the worker).
struct CtxGuard {
    name: Arc<str>,
    uid: u64,
    vm_id: u64,
    ctx: u32,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if let Some(Err(e)) = vm::with_same_vm(self.uid, self.vm_id, |vm| vm.finish(self.ctx, true))
        {
            tracing::error!(
                "{}: failed to run wasm plugin: {}",
                self.name,
                vm::describe(&e)
            );
        }
    }
}

enum Next {
    Continue,
    Exit(Exit),
    More,
}

fn local_exit(local: LocalResponse) -> Exit {
    let status = StatusCode::from_u16(local.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut exit = Exit::body(status, local.body);
    for (k, v) in local.headers {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(&k), HeaderValue::from_bytes(&v)) {
            exit = exit.with_header(k, v);
        }
    }
    exit
}

/// Moves the request's headers and facts into `call` for a call-in.
fn fill_request(call: &mut Call, ctx: &mut PluginCtx<'_>) {
    if call.method.is_none() {
        call.method = Some(ctx.method().clone());
        call.path = ctx.request_uri().to_owned();
        call.scheme = if ctx.var("scheme").as_deref() == Some("https") {
            "https"
        } else {
            "http"
        };
        call.props = PROPS
            .iter()
            .filter_map(|n| Some((*n, ctx.var(n)?.into_owned())))
            .collect();
    }
    call.req_headers = std::mem::take(ctx.headers_mut());
}

/// Moves the headers back and applies what the module changed.
fn restore_request(call: &mut Call, ctx: &mut PluginCtx<'_>) {
    *ctx.headers_mut() = std::mem::take(&mut call.req_headers);
    if std::mem::take(&mut call.path_set) {
        let (path, query) = match call.path.split_once('?') {
            Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
            None => (call.path.clone(), None),
        };
        ctx.set_upstream_path(path);
        ctx.set_upstream_query(query);
    }
    if std::mem::take(&mut call.method_set) {
        if let Some(m) = &call.method {
            ctx.set_upstream_method(m.clone());
        }
    }
    if std::mem::take(&mut call.req_body_set) {
        let body = call.req_body.clone().unwrap_or_default();
        ctx.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        ctx.replace_body(body);
    }
}

/// An HTTP context's owner: (`Loaded::uid`, `RootKey::id`).
type EntryKey = (u64, u64);

fn take_entry(ctx: &mut PluginCtx<'_>, key: EntryKey) -> Option<Entry> {
    let list = ctx.get_mut::<WasmRequest>()?;
    list.0
        .iter_mut()
        .find(|e| e.as_ref().is_some_and(|e| e.key == key))?
        .take()
}

fn put_entry(ctx: &mut PluginCtx<'_>, entry: Entry) {
    if ctx.get::<WasmRequest>().is_none() {
        ctx.insert(WasmRequest::default());
    }
    let Some(list) = ctx.get_mut::<WasmRequest>() else {
        return;
    };
    match list.0.iter_mut().find(|e| e.is_none()) {
        Some(slot) => *slot = Some(entry),
        None => list.0.push(Some(entry)),
    }
}

impl WasmConf {
    fn name(&self) -> &str {
        &self.loaded.name
    }

    fn key(&self) -> EntryKey {
        (self.loaded.uid, self.root.id)
    }

    /// This request's HTTP context for this conf, made (with the worker's root context for
    /// the conf, configured on first use) when it has none.
    fn entry(&self, ctx: &mut PluginCtx<'_>) -> Result<Entry, Fail> {
        if let Some(e) = take_entry(ctx, self.key()) {
            return Ok(e);
        }
        let made = vm::with_vm(&self.loaded, |vm| match vm.root(&self.root)? {
            Configured::Ready(root, ticks) => Ok(Some((vm.id, root, vm.http_ctx(root)?, ticks))),
            Configured::Refused => Ok(None),
        });
        let (vm_id, root_ctx, http_ctx, ticks) = match made {
            Ok(Some(m)) => m,
            Ok(None) => return Err(Fail::Ctx("failed to configure the plugin context".into())),
            Err(e) => return Err(Fail::Ctx(vm::describe(&e))),
        };
        self.start_ticks(vm_id, ticks);
        ctx.add_guard(Box::new(CtxGuard {
            name: self.loaded.name.clone(),
            uid: self.loaded.uid,
            vm_id,
            ctx: http_ctx,
        }));
        Ok(Entry {
            key: self.key(),
            vm_id,
            ctx: http_ctx,
            root_ctx,
            call: Call::default(),
        })
    }

    /// Timers the module asked for: `proxy_on_tick` on this worker while the conf and the
    /// instance live. They run as tasks of the worker's own runtime, where the instance is.
    fn start_ticks(&self, vm_id: u64, ticks: Ticks) {
        if ticks.is_empty() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        for (root_ctx, ms) in ticks {
            if ms == 0 {
                continue;
            }
            let loaded = self.loaded.clone();
            let key: Weak<RootKey> = Arc::downgrade(&self.root);
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(u64::from(ms)));
                every.tick().await;
                loop {
                    every.tick().await;
                    if key.strong_count() == 0 {
                        break;
                    }
                    let ticked = vm::with_same_vm(loaded.uid, vm_id, |vm| {
                        if vm.root_alive(root_ctx) {
                            vm.tick(root_ctx).map(|()| true)
                        } else {
                            Ok(false)
                        }
                    });
                    match ticked {
                        Some(Ok(true)) => {}
                        Some(Err(e)) => {
                            let e = vm::describe(&e);
                            tracing::error!("{}: failed to run wasm plugin: {e}", loaded.name);
                            break;
                        }
                        _ => break,
                    }
                }
            });
        }
    }

    /// Runs `f` on the entry's instance with the request moved into its call.
    fn run(
        &self,
        entry: &mut Entry,
        ctx: &mut PluginCtx<'_>,
        f: impl FnOnce(&mut vm::WorkerVm, &mut Call, &Entry) -> Result<(), wasmtime::Error>,
    ) -> Result<(), Fail> {
        let mut call = std::mem::take(&mut entry.call);
        fill_request(&mut call, ctx);
        let out = vm::with_same_vm(self.loaded.uid, entry.vm_id, |vm| f(vm, &mut call, entry));
        restore_request(&mut call, ctx);
        entry.call = call;
        match out {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Fail::Run(vm::describe(&e))),
            None => Err(Fail::Run("its instance was discarded".into())),
        }
    }

    fn request_headers(&self, ctx: &mut PluginCtx<'_>) -> Result<Next, Fail> {
        let mut entry = self.entry(ctx)?;
        let out = self.run(&mut entry, ctx, |vm, call, e| {
            vm.request_headers(call, e.ctx).map(|_| ())
        });
        let next = match out {
            Err(e) => Err(e),
            Ok(()) => Ok(match entry.call.local.take() {
                Some(local) => Next::Exit(local_exit(local)),
                None if !entry.call.calls.is_empty() || entry.call.process_req_body => Next::More,
                None => Next::Continue,
            }),
        };
        put_entry(ctx, entry);
        next
    }

    /// The HTTP calls the module dispatched (each answer to its callback), then the body.
    async fn request_more(&self, ctx: &mut PluginCtx<'_>) -> Result<Next, Fail> {
        loop {
            let Some(mut entry) = take_entry(ctx, self.key()) else {
                return Ok(Next::Continue);
            };
            let calls = std::mem::take(&mut entry.call.calls);
            if !calls.is_empty() {
                put_entry(ctx, entry);
                for pending in calls {
                    let token = pending.token;
                    let answer = self.send(pending).await;
                    let Some(mut entry) = take_entry(ctx, self.key()) else {
                        return Ok(Next::Continue);
                    };
                    entry.call.callout = Some(answer);
                    let out = self.run(&mut entry, ctx, |vm, call, e| {
                        vm.http_call_response(call, e.ctx, e.root_ctx, token)
                    });
                    entry.call.callout = None;
                    let local = entry.call.local.take();
                    put_entry(ctx, entry);
                    out?;
                    if let Some(local) = local {
                        return Ok(Next::Exit(local_exit(local)));
                    }
                }
                // Calls the callbacks dispatched in turn, then the body.
                continue;
            }
            let body = std::mem::take(&mut entry.call.process_req_body);
            put_entry(ctx, entry);
            if !body {
                return Ok(Next::Continue);
            }
            let read = match ctx.read_body(BODY_LIMIT).await {
                Ok(b) => b.clone(),
                Err(e) => return Err(Fail::Run(format!("failed to get request body: {e}"))),
            };
            let Some(mut entry) = take_entry(ctx, self.key()) else {
                return Ok(Next::Continue);
            };
            entry.call.req_body = Some(read);
            let out = self.run(&mut entry, ctx, |vm, call, e| vm.request_body(call, e.ctx));
            entry.call.req_body = None;
            let local = entry.call.local.take();
            put_entry(ctx, entry);
            out?;
            if let Some(local) = local {
                return Ok(Next::Exit(local_exit(local)));
            }
        }
    }

    /// Sends a dispatched call: the upstream is `host:port` (APISIX's wasm-nginx-module takes
    /// the cluster name as the address), `:method`, `:path`, `:scheme` and `:authority` from
    /// the pseudo-headers. A failed call reaches the callback with no headers and no body.
    async fn send(&self, pending: PendingCall) -> CallResponse {
        let mut method = Method::GET;
        let mut path = "/".to_owned();
        let mut scheme = "http".to_owned();
        let mut builder = Request::builder();
        for (k, v) in &pending.headers {
            let v_str = String::from_utf8_lossy(v);
            match &k[..] {
                b":method" => method = Method::from_bytes(v).unwrap_or(Method::GET),
                b":path" => path = v_str.into_owned(),
                b":scheme" => scheme = v_str.into_owned(),
                b":authority" => builder = builder.header(header::HOST, &v[..]),
                k if k.starts_with(b":") => {}
                k => {
                    if http::HeaderName::from_bytes(k).is_err() {
                        tracing::error!(
                            "{}: http call with an invalid header name {:?}",
                            self.name(),
                            String::from_utf8_lossy(k)
                        );
                        return CallResponse::default();
                    }
                    builder = builder.header(k, &v[..]);
                }
            }
        }
        let uri = format!("{scheme}://{}{path}", pending.upstream);
        let timeout = match pending.timeout_ms {
            0 => DEFAULT_CALL_TIMEOUT,
            ms => Duration::from_millis(u64::from(ms)),
        };
        let req = match builder
            .method(method)
            .uri(&uri)
            .body(Bytes::from(pending.body))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{}: bad http call to {uri}: {e}", self.name());
                return CallResponse::default();
            }
        };
        match self.services.http().send(req, timeout).await {
            Ok(resp) => {
                let (parts, body) = resp.into_parts();
                let mut headers = vec![(
                    b":status".to_vec(),
                    parts.status.as_str().as_bytes().to_vec(),
                )];
                headers.extend(
                    parts
                        .headers
                        .iter()
                        .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())),
                );
                CallResponse { headers, body }
            }
            Err(e) => {
                tracing::error!("{}: http call to {uri} failed: {e}", self.name());
                CallResponse::default()
            }
        }
    }

    fn request_phase<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        match self.request_headers(ctx) {
            Ok(Next::Continue) => Step::CONTINUE,
            Ok(Next::Exit(e)) => Step::exit(e),
            Ok(Next::More) => Step::Wait(Box::pin(async move {
                match self.request_more(ctx).await {
                    Ok(Next::Exit(e)) => ferrisix_plugin_api::Flow::Exit(e),
                    Ok(_) => ferrisix_plugin_api::Flow::Continue,
                    Err(e) => ferrisix_plugin_api::Flow::Exit(self.failed(e)),
                }
            })),
            Err(e) => Step::exit(self.failed(e)),
        }
    }

    /// Logs `e` as APISIX does and answers its status for it, 503.
    fn failed(&self, e: Fail) -> Exit {
        self.log_fail(e);
        Exit::status(StatusCode::SERVICE_UNAVAILABLE)
    }

    fn log_fail(&self, e: Fail) {
        match e {
            Fail::Ctx(e) => {
                tracing::error!("{}: failed to fetch wasm plugin ctx: {e}", self.name())
            }
            Fail::Run(e) => tracing::error!("{}: failed to run wasm plugin: {e}", self.name()),
        }
    }
}

impl Plugin for WasmConf {
    fn phases(&self) -> Phases {
        let request = if self.rewrite {
            Phases::REWRITE
        } else {
            Phases::ACCESS
        };
        request | Phases::HEADER_FILTER
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.request_phase(ctx)
    }

    fn access<'a>(&'a self, ctx: &'a mut PluginCtx<'_>) -> Step<'a> {
        self.request_phase(ctx)
    }

    /// `proxy_on_response_headers`; a failure is logged and the answer goes on unchanged
    /// (APISIX ignores a status returned from `header_filter`).
    fn header_filter(&self, ctx: &mut PluginCtx<'_>, resp: &mut ResponseHead<'_>) {
        let mut entry = match self.entry(ctx) {
            Ok(e) => e,
            Err(e) => return self.log_fail(e),
        };
        let mut call = std::mem::take(&mut entry.call);
        // The request's headers stay readable (and writable, to no effect upstream).
        fill_request(&mut call, ctx);
        call.resp_status = Some(resp.status().as_u16());
        call.resp_headers = std::mem::take(resp.headers_mut());
        let out = vm::with_same_vm(self.loaded.uid, entry.vm_id, |vm| {
            vm.response_headers(&mut call, entry.ctx)
        });
        *ctx.headers_mut() = std::mem::take(&mut call.req_headers);
        *resp.headers_mut() = std::mem::take(&mut call.resp_headers);
        if std::mem::take(&mut call.status_set) {
            if let Some(s) = call.resp_status.and_then(|s| StatusCode::from_u16(s).ok()) {
                resp.set_status(s);
            }
        }
        call.resp_status = None;
        call.local = None;
        let body = std::mem::take(&mut call.process_resp_body);
        entry.call = call;
        let (uid, vm_id, http_ctx) = (self.loaded.uid, entry.vm_id, entry.ctx);
        put_entry(ctx, entry);
        match out {
            Some(Ok(())) => {}
            Some(Err(e)) => return self.log_fail(Fail::Run(vm::describe(&e))),
            None => return self.log_fail(Fail::Run("its instance was discarded".into())),
        }
        if body {
            // The module may change the body's length.
            resp.headers_mut().remove(header::CONTENT_LENGTH);
            resp.add_body_filter(Box::new(ResponseBody {
                name: self.loaded.name.clone(),
                uid,
                vm_id,
                ctx: http_ctx,
                held: BytesMut::new(),
            }));
        }
    }
}

/// `proxy_on_response_body` on each chunk. A module answering `Pause` holds what it saw, and
/// sees it again with the next chunk (Envoy's buffering); at the end it all goes on.
struct ResponseBody {
    name: Arc<str>,
    uid: u64,
    vm_id: u64,
    ctx: u32,
    held: BytesMut,
}

impl BodyFilter for ResponseBody {
    fn filter(&mut self, chunk: &mut BodyChunk) {
        self.held.extend_from_slice(&chunk.data);
        let seen = std::mem::take(&mut self.held).freeze();
        let mut call = Call {
            resp_body: Some(seen.to_vec()),
            ..Call::default()
        };
        let end = chunk.end;
        let out = vm::with_same_vm(self.uid, self.vm_id, |vm| {
            vm.response_body(&mut call, self.ctx, end)
        });
        match out {
            Some(Ok(go_on)) => {
                let body = Bytes::from(call.resp_body.unwrap_or_default());
                if go_on || end {
                    chunk.data = body;
                } else {
                    self.held = BytesMut::from(&body[..]);
                    chunk.data = Bytes::new();
                }
            }
            Some(Err(e)) => {
                let e = vm::describe(&e);
                tracing::error!("{}: failed to run wasm plugin: {e}", self.name);
                chunk.data = seen;
            }
            None => chunk.data = seen,
        }
    }
}
