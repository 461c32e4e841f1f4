//! The host side of the proxy-wasm ABI: what a module may call (`env.proxy_*`), over the state
//! of the call in progress ([`Call`]). A module sees nothing of the host but these calls: no
//! WASI filesystem, network, environment or arguments (the few WASI functions SDK runtimes
//! import answer without touching the host; see [`wasi`]).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use wasmtime::{
    Caller, Engine, Error, ExternType, Func, Linker, Memory, Module, StoreLimits, TypedFunc, Val,
    ValType,
};

use crate::abi::{self, buffer, map, status};
use crate::shared::Shared;

/// A local response a module asked for (`proxy_send_local_response`).
#[derive(Debug, Clone)]
pub(crate) struct LocalResponse {
    pub status: u16,
    pub body: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// An HTTP call a module dispatched (`proxy_http_call`), sent once the call-in returned.
#[derive(Debug, Clone)]
pub(crate) struct PendingCall {
    pub token: u32,
    pub upstream: String,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
    pub timeout_ms: u32,
}

/// The answer to an HTTP call, as the callback reads it.
#[derive(Debug, Default)]
pub(crate) struct CallResponse {
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Bytes,
}

/// The request as a module's calls see and change it. It lives with the request between its
/// phases (one per plugin context and request) and moves into the store for each call-in.
#[derive(Debug, Default)]
pub(crate) struct Call {
    /// The client's request headers (moved out of the request for the call-in, and back).
    pub req_headers: HeaderMap,
    pub method: Option<Method>,
    pub path: String,
    pub scheme: &'static str,
    /// `:path` or `:method` were replaced.
    pub path_set: bool,
    pub method_set: bool,
    /// The response head in `header_filter`.
    pub resp_status: Option<u16>,
    pub resp_headers: HeaderMap,
    pub status_set: bool,
    pub req_body: Option<Bytes>,
    pub req_body_set: bool,
    pub resp_body: Option<Vec<u8>>,
    /// Request variables readable as properties, collected when the request phase starts.
    pub props: Vec<(&'static str, String)>,
    /// Properties the module set, readable again in its later calls of the request.
    pub user_props: Vec<(Vec<u8>, Vec<u8>)>,
    pub local: Option<LocalResponse>,
    pub calls: Vec<PendingCall>,
    pub callout: Option<CallResponse>,
    /// APISIX's `wasm_process_req_body` and `wasm_process_resp_body`.
    pub process_req_body: bool,
    pub process_resp_body: bool,
}

/// A store's data: the limits, the plugin's shared state, and the call in progress.
pub(crate) struct HostState {
    pub limits: StoreLimits,
    pub name: Arc<str>,
    pub shared: Arc<Shared>,
    pub memory: Option<Memory>,
    /// The module's allocator (`proxy_on_memory_allocate`, or `malloc` in older SDKs).
    pub malloc: Option<TypedFunc<u32, u32>>,
    pub call: Call,
    /// The plugin configuration `proxy_on_configure` reads.
    pub conf: Bytes,
    /// Tick periods asked for during this call-in: (context, milliseconds).
    pub ticks: Vec<(u32, u32)>,
    /// Queues that got an item during this call-in.
    pub queue_ready: Vec<u32>,
    /// Queues registered during this call-in.
    pub registered: Vec<u32>,
    pub effective: u32,
    pub next_token: u32,
    rng: u64,
}

impl HostState {
    pub(crate) fn new(name: Arc<str>, shared: Arc<Shared>, limits: StoreLimits) -> HostState {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
        HostState {
            limits,
            name,
            shared,
            memory: None,
            malloc: None,
            call: Call::default(),
            conf: Bytes::new(),
            ticks: Vec::new(),
            queue_ready: Vec::new(),
            registered: Vec::new(),
            effective: 0,
            next_token: 1,
            rng: seed | 1,
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: random_get is for modules' own sampling, not for secrets.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

type C<'a> = Caller<'a, HostState>;

fn mem(c: &C<'_>) -> Option<Memory> {
    c.data().memory
}

/// `len` bytes of the module's memory at `ptr`.
fn read(c: &C<'_>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let m = mem(c)?;
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    m.data(c)
        .get(ptr..ptr.checked_add(len)?)
        .map(<[u8]>::to_vec)
}

fn write(c: &mut C<'_>, ptr: i32, bytes: &[u8]) -> bool {
    let Some(m) = mem(c) else { return false };
    let ptr = ptr as u32 as usize;
    match m.data_mut(c).get_mut(ptr..ptr.saturating_add(bytes.len())) {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            true
        }
        None => false,
    }
}

fn write_u32(c: &mut C<'_>, ptr: i32, v: u32) -> bool {
    write(c, ptr, &v.to_le_bytes())
}

/// Copies `bytes` into memory the module allocates and writes where and how long it is to
/// `ret_ptr` and `ret_len`.
fn give(c: &mut C<'_>, bytes: &[u8], ret_ptr: i32, ret_len: i32) -> Result<i32, Error> {
    let at = if bytes.is_empty() {
        0
    } else {
        let Some(malloc) = c.data().malloc.clone() else {
            return Ok(status::UNIMPLEMENTED);
        };
        let at = malloc.call(&mut *c, bytes.len() as u32)?;
        if at == 0 || !write(c, at as i32, bytes) {
            return Ok(status::INVALID_MEMORY_ACCESS);
        }
        at
    };
    if write_u32(c, ret_ptr, at) && write_u32(c, ret_len, bytes.len() as u32) {
        Ok(status::OK)
    } else {
        Ok(status::INVALID_MEMORY_ACCESS)
    }
}

/// `read`, or the status for a bad pointer.
macro_rules! arg {
    ($c:expr, $ptr:expr, $len:expr) => {
        match read(&$c, $ptr, $len) {
            Some(b) => b,
            None => return Ok(status::INVALID_MEMORY_ACCESS),
        }
    };
}

/// The names `env` functions the host implements are linked under.
const HOST_CALLS: &[&str] = &[
    "proxy_log",
    "proxy_get_log_level",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_property",
    "proxy_set_property",
    "proxy_get_buffer_bytes",
    "proxy_get_buffer_status",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_add_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_get_header_map_size",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_set_effective_context",
    "proxy_done",
    "proxy_continue_stream",
    "proxy_continue_request",
    "proxy_continue_response",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_register_shared_queue",
    "proxy_resolve_shared_queue",
    "proxy_enqueue_shared_queue",
    "proxy_dequeue_shared_queue",
];

/// The linker for `module`: the host calls, the WASI functions SDK runtimes import, and, for
/// any other function the module imports, one that answers `Unimplemented` (or traps, where
/// the import returns no status), so a module using a call ferrisix lacks still loads and
/// learns it at the call.
pub(crate) fn linker(engine: &Engine, module: &Module) -> Result<Linker<HostState>, Error> {
    let mut l = Linker::new(engine);
    // A module may import one function twice; the second definition is the same.
    l.allow_shadowing(true);
    define_host_calls(&mut l)?;
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else {
            continue;
        };
        let (module_name, name) = (import.module(), import.name());
        if module_name == "env" && HOST_CALLS.contains(&name) {
            continue;
        }
        let is_wasi = module_name.starts_with("wasi");
        let owned = name.to_owned();
        let returns_i32 =
            ty.results().len() == 1 && matches!(ty.results().next(), Some(ValType::I32));
        l.func_new(module_name, name, ty, move |mut c, params, results| {
            if is_wasi {
                return wasi(&mut c, &owned, params, results);
            }
            if returns_i32 {
                results[0] = Val::I32(status::UNIMPLEMENTED);
                return Ok(());
            }
            Err(Error::msg(format!("host call {owned} is not implemented")))
        })?;
    }
    Ok(l)
}

/// The WASI functions an SDK's runtime imports (TinyGo's, AssemblyScript's abort): exiting
/// traps, time and randomness answer, the environment and arguments are empty, output is
/// refused, and everything else is `ENOSYS`.
fn wasi(c: &mut C<'_>, name: &str, params: &[Val], results: &mut [Val]) -> Result<(), Error> {
    const ESUCCESS: i32 = 0;
    const EBADF: i32 = 8;
    const ENOSYS: i32 = 52;
    let p = |i: usize| params.get(i).and_then(Val::i32).unwrap_or(0);
    let errno = match name {
        "proc_exit" => return Err(Error::msg(format!("module exited with code {}", p(0)))),
        "random_get" => {
            let (ptr, len) = (p(0), p(1) as u32 as usize);
            let mut bytes = Vec::with_capacity(len);
            while bytes.len() < len {
                bytes.extend_from_slice(&c.data_mut().random().to_le_bytes());
            }
            bytes.truncate(len);
            if write(c, ptr, &bytes) {
                ESUCCESS
            } else {
                EBADF
            }
        }
        "clock_time_get" => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let at = params.get(2).and_then(Val::i32).unwrap_or(0);
            if write(c, at, &now.to_le_bytes()) {
                ESUCCESS
            } else {
                EBADF
            }
        }
        "environ_sizes_get" | "args_sizes_get" => {
            if write_u32(c, p(0), 0) && write_u32(c, p(1), 0) {
                ESUCCESS
            } else {
                EBADF
            }
        }
        "environ_get" | "args_get" | "sched_yield" => ESUCCESS,
        "fd_write" | "fd_read" | "fd_close" | "fd_seek" | "fd_fdstat_get" | "fd_prestat_get" => {
            EBADF
        }
        _ => ENOSYS,
    };
    if let Some(r) = results.get_mut(0) {
        *r = Val::I32(errno);
    }
    Ok(())
}

fn header_name(name: &[u8]) -> Option<HeaderName> {
    HeaderName::from_bytes(name).ok()
}

/// The header map `ty` of the call, `None` for one this call has no access to.
fn header_map(call: &mut Call, ty: i32) -> Option<&mut HeaderMap> {
    match ty {
        map::REQUEST_HEADERS => Some(&mut call.req_headers),
        map::RESPONSE_HEADERS if call.resp_status.is_some() => Some(&mut call.resp_headers),
        _ => None,
    }
}

/// The pseudo-header `name` of map `ty`.
fn pseudo(call: &Call, ty: i32, name: &[u8]) -> Option<Vec<u8>> {
    match (ty, name) {
        (map::REQUEST_HEADERS, b":method") => {
            Some(call.method.as_ref()?.as_str().as_bytes().to_vec())
        }
        (map::REQUEST_HEADERS, b":path") => Some(call.path.as_bytes().to_vec()),
        (map::REQUEST_HEADERS, b":scheme") => Some(call.scheme.as_bytes().to_vec()),
        (map::REQUEST_HEADERS, b":authority") => call
            .req_headers
            .get(http::header::HOST)
            .map(|v| v.as_bytes().to_vec()),
        (map::RESPONSE_HEADERS, b":status") => Some(call.resp_status?.to_string().into_bytes()),
        _ => None,
    }
}

/// All pairs of map `ty`, pseudo-headers first (as Envoy lists them).
fn pairs_of(call: &Call, ty: i32) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let (names, headers): (&[&[u8]], &HeaderMap) = match ty {
        map::REQUEST_HEADERS => (
            &[b":authority", b":path", b":method", b":scheme"],
            &call.req_headers,
        ),
        map::RESPONSE_HEADERS if call.resp_status.is_some() => (&[b":status"], &call.resp_headers),
        map::HTTP_CALL_RESPONSE_HEADERS => {
            return call.callout.as_ref().map(|r| r.headers.clone());
        }
        map::REQUEST_TRAILERS | map::RESPONSE_TRAILERS | map::HTTP_CALL_RESPONSE_TRAILERS => {
            return Some(Vec::new())
        }
        _ => return None,
    };
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = names
        .iter()
        .filter_map(|n| Some((n.to_vec(), pseudo(call, ty, n)?)))
        .collect();
    out.extend(
        headers
            .iter()
            .map(|(k, v)| (k.as_str().as_bytes().to_vec(), v.as_bytes().to_vec())),
    );
    Some(out)
}

/// Sets a pseudo-header; `false` when `name` is none this map can change.
fn set_pseudo(call: &mut Call, ty: i32, name: &[u8], value: &[u8]) -> bool {
    match (ty, name) {
        (map::REQUEST_HEADERS, b":path") => {
            call.path = String::from_utf8_lossy(value).into_owned();
            call.path_set = true;
        }
        (map::REQUEST_HEADERS, b":method") => match Method::from_bytes(value) {
            Ok(m) => {
                call.method = Some(m);
                call.method_set = true;
            }
            Err(_) => return false,
        },
        (map::RESPONSE_HEADERS, b":status") => {
            match std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()) {
                Some(s @ 100..=999) => {
                    call.resp_status = Some(s);
                    call.status_set = true;
                }
                _ => return false,
            }
        }
        (map::REQUEST_HEADERS, b":authority") => {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                call.req_headers.insert(http::header::HOST, v);
            }
        }
        _ => return false,
    }
    true
}

/// A property: APISIX's request variables by name (`remote_addr`), Envoy-style paths for the
/// common ones (`request.path`, `source.address`), the plugin's own facts, and what the module
/// set earlier in the request.
fn property(state: &HostState, path: &[u8]) -> Option<Vec<u8>> {
    let call = &state.call;
    if let Some((_, v)) = call.user_props.iter().rev().find(|(k, _)| k == path) {
        return Some(v.clone());
    }
    let segs = abi::path_segments(path);
    let var = match segs.as_slice() {
        [b"plugin_root_id"] | [b"plugin_vm_id"] => return Some(Vec::new()),
        [b"plugin_name"] => return Some(state.name.as_bytes().to_vec()),
        [b"request", b"path"] => return Some(call.path.as_bytes().to_vec()),
        [b"request", b"method"] => return Some(call.method.as_ref()?.as_str().as_bytes().to_vec()),
        [b"request", b"scheme"] => return Some(call.scheme.as_bytes().to_vec()),
        [b"request", b"host"] => "host",
        [b"source", b"address"] => "remote_addr",
        [b"source", b"port"] => "remote_port",
        [b"response", b"code"] => return Some(call.resp_status?.to_string().into_bytes()),
        [one] => std::str::from_utf8(one).ok()?,
        _ => return None,
    };
    call.props
        .iter()
        .find(|(k, _)| *k == var)
        .map(|(_, v)| v.as_bytes().to_vec())
}

fn log_level_now() -> i32 {
    use tracing::level_filters::LevelFilter;
    match LevelFilter::current() {
        LevelFilter::TRACE => 0,
        LevelFilter::DEBUG => 1,
        LevelFilter::INFO => 2,
        LevelFilter::WARN => 3,
        _ => 4,
    }
}

fn define_host_calls(l: &mut Linker<HostState>) -> Result<(), Error> {
    l.func_wrap(
        "env",
        "proxy_log",
        |c: C<'_>, level: i32, ptr: i32, len: i32| -> Result<i32, Error> {
            let msg = arg!(c, ptr, len);
            let msg = String::from_utf8_lossy(&msg);
            let name = &*c.data().name;
            // The module's own words, into the gateway's log at the module's level.
            match level {
                0 => tracing::trace!(target: "wasm", "{name}: {msg}"),
                1 => tracing::debug!(target: "wasm", "{name}: {msg}"),
                2 => tracing::info!(target: "wasm", "{name}: {msg}"),
                3 => tracing::warn!(target: "wasm", "{name}: {msg}"),
                _ => tracing::error!(target: "wasm", "{name}: {msg}"),
            }
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C<'_>, ret: i32| -> i32 {
            if write_u32(&mut c, ret, log_level_now() as u32) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| -> i32 {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            if write(&mut c, ret, &now.to_le_bytes()) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, ms: i32| -> i32 {
            let ctx = c.data().effective;
            c.data_mut().ticks.push((ctx, ms as u32));
            status::OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, ptr: i32, len: i32, ret_ptr: i32, ret_len: i32| -> Result<i32, Error> {
            let path = arg!(c, ptr, len);
            match property(c.data(), &path) {
                Some(v) => give(&mut c, &v, ret_ptr, ret_len),
                None => Ok(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C<'_>, ptr: i32, len: i32, vptr: i32, vlen: i32| -> Result<i32, Error> {
            let path = arg!(c, ptr, len);
            let value = arg!(c, vptr, vlen);
            let call = &mut c.data_mut().call;
            // APISIX's switches for the body callbacks (wasm.lua reads them after the call).
            match abi::path_segments(&path).as_slice() {
                [b"wasm_process_req_body"] => call.process_req_body = !value.is_empty(),
                [b"wasm_process_resp_body"] => call.process_resp_body = !value.is_empty(),
                _ => {}
            }
            call.user_props.retain(|(k, _)| *k != path);
            call.user_props.push((path, value));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>,
         ty: i32,
         start: i32,
         max: i32,
         ret_ptr: i32,
         ret_len: i32|
         -> Result<i32, Error> {
            let data = c.data();
            let whole: &[u8] = match ty {
                buffer::REQUEST_BODY => match &data.call.req_body {
                    Some(b) => b,
                    None => return Ok(status::NOT_FOUND),
                },
                buffer::RESPONSE_BODY => match &data.call.resp_body {
                    Some(b) => b,
                    None => return Ok(status::NOT_FOUND),
                },
                buffer::HTTP_CALL_RESPONSE_BODY => match &data.call.callout {
                    Some(r) => &r.body,
                    None => return Ok(status::NOT_FOUND),
                },
                buffer::PLUGIN_CONFIGURATION => &data.conf,
                buffer::VM_CONFIGURATION => &[],
                _ => return Ok(status::BAD_ARGUMENT),
            };
            let start = (start as u32 as usize).min(whole.len());
            let end = start.saturating_add(max as u32 as usize).min(whole.len());
            let slice = whole[start..end].to_vec();
            give(&mut c, &slice, ret_ptr, ret_len)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_status",
        |mut c: C<'_>, ty: i32, len_ptr: i32, flags_ptr: i32| -> i32 {
            let data = c.data();
            let len = match ty {
                buffer::REQUEST_BODY => data.call.req_body.as_ref().map(Bytes::len),
                buffer::RESPONSE_BODY => data.call.resp_body.as_ref().map(Vec::len),
                buffer::HTTP_CALL_RESPONSE_BODY => data.call.callout.as_ref().map(|r| r.body.len()),
                buffer::PLUGIN_CONFIGURATION => Some(data.conf.len()),
                buffer::VM_CONFIGURATION => Some(0),
                _ => return status::BAD_ARGUMENT,
            };
            let Some(len) = len else {
                return status::NOT_FOUND;
            };
            if write_u32(&mut c, len_ptr, len as u32) && write_u32(&mut c, flags_ptr, 1) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, ty: i32, start: i32, size: i32, ptr: i32, len: i32| -> Result<i32, Error> {
            let data = arg!(c, ptr, len);
            let call = &mut c.data_mut().call;
            let splice = |old: &[u8]| -> Vec<u8> {
                let start = (start as u32 as usize).min(old.len());
                let end = start.saturating_add(size as u32 as usize).min(old.len());
                let mut out = Vec::with_capacity(old.len() - (end - start) + data.len());
                out.extend_from_slice(&old[..start]);
                out.extend_from_slice(&data);
                out.extend_from_slice(&old[end..]);
                out
            };
            match ty {
                buffer::REQUEST_BODY => {
                    let old = call.req_body.clone().unwrap_or_default();
                    call.req_body = Some(Bytes::from(splice(&old)));
                    call.req_body_set = true;
                }
                buffer::RESPONSE_BODY => {
                    let old = call.resp_body.take().unwrap_or_default();
                    call.resp_body = Some(splice(&old));
                }
                _ => return Ok(status::BAD_ARGUMENT),
            }
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, ty: i32, ret_ptr: i32, ret_len: i32| -> Result<i32, Error> {
            let Some(pairs) = pairs_of(&c.data().call, ty) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let wire = abi::encode_pairs(pairs.iter().map(|(k, v)| (&k[..], &v[..])));
            give(&mut c, &wire, ret_ptr, ret_len)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, ty: i32, ptr: i32, len: i32| -> Result<i32, Error> {
            let wire = arg!(c, ptr, len);
            let Some(pairs) = abi::decode_pairs(&wire) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let call = &mut c.data_mut().call;
            match header_map(call, ty) {
                Some(h) => h.clear(),
                None => return Ok(status::BAD_ARGUMENT),
            }
            for (k, v) in pairs {
                if k.starts_with(b":") {
                    set_pseudo(call, ty, &k, &v);
                    continue;
                }
                let (Some(name), Ok(value)) = (header_name(&k), HeaderValue::from_bytes(&v)) else {
                    continue;
                };
                if let Some(h) = header_map(call, ty) {
                    h.append(name, value);
                }
            }
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>,
         ty: i32,
         kp: i32,
         kl: i32,
         ret_ptr: i32,
         ret_len: i32|
         -> Result<i32, Error> {
            let key = arg!(c, kp, kl).to_ascii_lowercase();
            let call = &c.data().call;
            let value = if ty == map::HTTP_CALL_RESPONSE_HEADERS {
                call.callout
                    .as_ref()
                    .and_then(|r| r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(&key)))
                    .map(|(_, v)| v.clone())
            } else if key.starts_with(b":") {
                pseudo(call, ty, &key)
            } else {
                let headers = match ty {
                    map::REQUEST_HEADERS => &call.req_headers,
                    map::RESPONSE_HEADERS if call.resp_status.is_some() => &call.resp_headers,
                    map::REQUEST_TRAILERS
                    | map::RESPONSE_TRAILERS
                    | map::HTTP_CALL_RESPONSE_TRAILERS => return Ok(status::NOT_FOUND),
                    _ => return Ok(status::BAD_ARGUMENT),
                };
                // Several values of one name read as one, comma-separated (as Envoy joins them).
                let mut it = std::str::from_utf8(&key)
                    .ok()
                    .map(|k| headers.get_all(k).iter())
                    .into_iter()
                    .flatten();
                it.next().map(|first| {
                    let mut v = first.as_bytes().to_vec();
                    for more in it {
                        v.push(b',');
                        v.extend_from_slice(more.as_bytes());
                    }
                    v
                })
            };
            match value {
                Some(v) => give(&mut c, &v, ret_ptr, ret_len),
                None => Ok(status::NOT_FOUND),
            }
        },
    )?;
    for (name, replace) in [
        ("proxy_replace_header_map_value", true),
        ("proxy_add_header_map_value", false),
    ] {
        l.func_wrap(
            "env",
            name,
            move |mut c: C<'_>,
                  ty: i32,
                  kp: i32,
                  kl: i32,
                  vp: i32,
                  vl: i32|
                  -> Result<i32, Error> {
                let key = arg!(c, kp, kl).to_ascii_lowercase();
                let value = arg!(c, vp, vl);
                let call = &mut c.data_mut().call;
                if key.starts_with(b":") {
                    return Ok(if set_pseudo(call, ty, &key, &value) {
                        status::OK
                    } else {
                        status::BAD_ARGUMENT
                    });
                }
                let (Some(name), Ok(value)) = (header_name(&key), HeaderValue::from_bytes(&value))
                else {
                    return Ok(status::BAD_ARGUMENT);
                };
                let Some(h) = header_map(call, ty) else {
                    return Ok(status::BAD_ARGUMENT);
                };
                if replace {
                    h.insert(name, value);
                } else {
                    h.append(name, value);
                }
                Ok(status::OK)
            },
        )?;
    }
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, kl: i32| -> Result<i32, Error> {
            let key = arg!(c, kp, kl).to_ascii_lowercase();
            let Some(name) = header_name(&key) else {
                return Ok(status::OK);
            };
            match header_map(&mut c.data_mut().call, ty) {
                Some(h) => {
                    h.remove(name);
                    Ok(status::OK)
                }
                None => Ok(status::BAD_ARGUMENT),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_size",
        |mut c: C<'_>, ty: i32, ret: i32| -> i32 {
            let Some(pairs) = pairs_of(&c.data().call, ty) else {
                return status::BAD_ARGUMENT;
            };
            let size = abi::encode_pairs(pairs.iter().map(|(k, v)| (&k[..], &v[..]))).len();
            if write_u32(&mut c, ret, size as u32) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         code: i32,
         _dp: i32,
         _dl: i32,
         bp: i32,
         bl: i32,
         hp: i32,
         hl: i32,
         _grpc: i32|
         -> Result<i32, Error> {
            let body = arg!(c, bp, bl);
            let wire = arg!(c, hp, hl);
            let Some(headers) = abi::decode_pairs(&wire) else {
                return Ok(status::BAD_ARGUMENT);
            };
            if !(100..=999).contains(&code) {
                return Ok(status::BAD_ARGUMENT);
            }
            c.data_mut().call.local = Some(LocalResponse {
                status: code as u16,
                body,
                headers,
            });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         ul: i32,
         hp: i32,
         hl: i32,
         bp: i32,
         bl: i32,
         _tp: i32,
         _tl: i32,
         timeout: i32,
         token_ptr: i32|
         -> Result<i32, Error> {
            let upstream = arg!(c, up, ul);
            let wire = arg!(c, hp, hl);
            let body = arg!(c, bp, bl);
            let Some(headers) = abi::decode_pairs(&wire) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let Ok(upstream) = String::from_utf8(upstream) else {
                return Ok(status::BAD_ARGUMENT);
            };
            if upstream.is_empty() {
                return Ok(status::BAD_ARGUMENT);
            }
            let token = c.data().next_token;
            if !write_u32(&mut c, token_ptr, token) {
                return Ok(status::INVALID_MEMORY_ACCESS);
            }
            let data = c.data_mut();
            data.next_token = token.wrapping_add(1).max(1);
            data.call.calls.push(PendingCall {
                token,
                upstream,
                headers,
                body,
                timeout_ms: timeout as u32,
            });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, ctx: i32| -> i32 {
            c.data_mut().effective = ctx as u32;
            status::OK
        },
    )?;
    l.func_wrap("env", "proxy_done", |_: C<'_>| -> i32 { status::OK })?;
    // The request goes on once the call-in (and its HTTP calls) returned: resuming is the
    // host's default, so these only acknowledge.
    l.func_wrap("env", "proxy_continue_stream", |_: C<'_>, _t: i32| -> i32 {
        status::OK
    })?;
    l.func_wrap("env", "proxy_continue_request", |_: C<'_>| -> i32 {
        status::OK
    })?;
    l.func_wrap("env", "proxy_continue_response", |_: C<'_>| -> i32 {
        status::OK
    })?;
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>,
         kp: i32,
         kl: i32,
         ret_ptr: i32,
         ret_len: i32,
         cas_ptr: i32|
         -> Result<i32, Error> {
            let key = arg!(c, kp, kl);
            let Some((value, cas)) = c.data().shared.get(&key) else {
                return Ok(status::NOT_FOUND);
            };
            if !write_u32(&mut c, cas_ptr, cas) {
                return Ok(status::INVALID_MEMORY_ACCESS);
            }
            give(&mut c, &value, ret_ptr, ret_len)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |c: C<'_>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| -> Result<i32, Error> {
            let key = arg!(c, kp, kl);
            let value = arg!(c, vp, vl);
            Ok(c.data().shared.set(&key, &value, cas as u32))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: i32, nl: i32, token_ptr: i32| -> Result<i32, Error> {
            let name = arg!(c, np, nl);
            let token = c.data().shared.register_queue(&name);
            c.data_mut().registered.push(token);
            Ok(if write_u32(&mut c, token_ptr, token) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            })
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vp: i32, vl: i32, np: i32, nl: i32, token_ptr: i32| -> Result<i32, Error> {
            let vm = arg!(c, vp, vl);
            let name = arg!(c, np, nl);
            // One VM per plugin: its own (empty) id or the plugin's name.
            if !vm.is_empty() && vm != c.data().name.as_bytes() {
                return Ok(status::NOT_FOUND);
            }
            let Some(token) = c.data().shared.resolve_queue(&name) else {
                return Ok(status::NOT_FOUND);
            };
            Ok(if write_u32(&mut c, token_ptr, token) {
                status::OK
            } else {
                status::INVALID_MEMORY_ACCESS
            })
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, token: i32, p: i32, len: i32| -> Result<i32, Error> {
            let item = arg!(c, p, len);
            let s = c.data().shared.enqueue(token as u32, &item);
            if s == status::OK {
                c.data_mut().queue_ready.push(token as u32);
            }
            Ok(s)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, token: i32, ret_ptr: i32, ret_len: i32| -> Result<i32, Error> {
            match c.data().shared.dequeue(token as u32) {
                Err(s) => Ok(s),
                Ok(None) => Ok(status::EMPTY),
                Ok(Some(item)) => give(&mut c, &item, ret_ptr, ret_len),
            }
        },
    )?;
    Ok(())
}

/// A function the module exports, typed; `None` when absent or of another type.
pub(crate) fn export<P, R>(
    store: &mut wasmtime::Store<HostState>,
    instance: &wasmtime::Instance,
    name: &str,
) -> Option<TypedFunc<P, R>>
where
    P: wasmtime::WasmParams,
    R: wasmtime::WasmResults,
{
    let f: Func = instance.get_func(&mut *store, name)?;
    f.typed(&*store).ok()
}
