//! Connection lifetime for every ferrisix listener (data plane, Admin API, control API,
//! metrics): what nginx bounds per connection, in one place so each listener gets the same
//! rules.
//!
//! * [`Acceptor`]: an accept loop that backs off when the process runs out of file descriptors
//!   (nginx disables accepting for `accept_mutex_delay` and keeps serving the open
//!   connections) instead of spinning, and logs that at most once a second.
//! * [`ConnLimits`] with [`ConnWatch`]: a connection must complete its first request head
//!   within `client_header_timeout` of being accepted (a silent client, a partial HTTP/2
//!   preface), and one with no request in flight is closed after `keepalive_timeout` (HTTP/1.1
//!   keep-alive and idle HTTP/2 sessions alike).
//! * [`TimedIo`]: nginx's `send_timeout`: a client that stops reading the response is cut off
//!   after that long without progress, which releases whatever the response was holding (an
//!   upstream connection).
//! * [`FramingGuard`]: nginx's bound on chunk sizes (2^63 - 1, then 400 at once), which hyper's
//!   decoder lacks, by following each request's framing as hyper reads it.
//! * [`Drain`]: stopping a server without failing a request: `Connection: close` on HTTP/1.1
//!   answers, GOAWAY on HTTP/2, idle connections closed only after a grace period.
//! * [`serve_until`]: the accept-and-serve loop of the servers beside the workers (Admin API,
//!   control API, prometheus export), with the rules above and a graceful stop.
//! * [`ListenerSet`] and [`handover`]: the process's listening sockets, bound once, and handed
//!   to a successor process (binary upgrade, restart) with the connections in their queues.
//! * [`yield_to_workers`]: the threads that are not serving requests (configuration, Admin
//!   API, health probes) give way to the workers when the cores are busy.
//! * [`coarse_monotonic_ms`]: the monotonic clock as of the last kernel tick, for idle
//!   timestamps that need no finer resolution and are read on every request.
//! * [`proxy_protocol`]: the PROXY protocol (v1 and v2) read off a fresh connection, and
//!   the v1 header written to an upstream.
//! * [`log_text`]: log lines that cannot flood: repeated warnings counted and summarised
//!   ([`Repeats`]), client-supplied text cut to a bounded length ([`clip`]).
#![forbid(unsafe_code)]

mod accept;
mod clock;
mod core_share;
mod drain;
mod framing;
pub mod handover;
mod io;
mod lifetime;
mod listeners;
pub mod log_text;
mod priority;
pub mod proxy_protocol;
mod serve;

pub use accept::Acceptor;
pub use clock::coarse_monotonic_ms;
pub use core_share::share_core;
pub use drain::{Drain, Open, IDLE_GRACE};
pub use framing::{ChunkSizeTooLarge, FramingGuard, MAX_CHUNK_SIZE};
pub use io::TimedIo;
pub use lifetime::{ConnLimits, ConnWatch, Graceful, HeadSignal, InFlight, Tracked};
pub use listeners::{bind, ListenerSet};
pub use log_text::{clip, Repeats};
pub use priority::{thread_cpu_time, yield_to_workers, CONTROL_NICENESS};
pub use serve::{serve_until, SHUTDOWN_GRACE};

/// The I/O a listener hands hyper: `send_timeout` on writes, nginx's chunk-size bound on
/// reads.
pub type ServedIo<S> = hyper_util::rt::TokioIo<TimedIo<FramingGuard<S>>>;

/// Wraps any accepted stream (plain TCP, TLS) for hyper, its reads reported to `watch`; see
/// [`ServedIo`].
pub fn served_io<S>(stream: S, limits: &ConnLimits, watch: &ConnWatch) -> ServedIo<S> {
    hyper_util::rt::TokioIo::new(
        TimedIo::new(FramingGuard::new(stream), limits.send_timeout)
            .with_head_signal(watch.head_signal()),
    )
}

/// Wraps an accepted stream for hyper: `send_timeout` on writes, the chunk-size bound on
/// reads, and the watch that bounds the connection's header and idle time. Serve the returned I/O, call
/// [`ConnWatch::begin`] in the service for each request, and run the connection future
/// through [`ConnWatch::run`].
pub fn wrap(
    stream: tokio::net::TcpStream,
    limits: &ConnLimits,
) -> (ServedIo<tokio::net::TcpStream>, ConnWatch) {
    let _ = stream.set_nodelay(true);
    let watch = ConnWatch::new(*limits);
    (served_io(stream, limits, &watch), watch)
}

/// The HTTP/1 settings every listener shares, for hyper's HTTP/1 builder and for the HTTP/1
/// half of hyper-util's auto-detecting one (two types with the same methods): keep-alive
/// unless `keepalive_timeout` is 0 (nginx: 0 disables it), nginx's header-count model and a
/// 64 KiB head limit. The header timeouts are [`ConnWatch`]'s, fed by the connection's reads
/// ([`TimedIo::with_head_signal`]): hyper's own timer boxes, arms and drops a sleep on every
/// request, work `benches/e2e/instructions.py` counts on the request path.
macro_rules! http1_settings {
    ($builder:expr, $limits:expr) => {
        $builder
            .keep_alive(!$limits.keepalive_timeout.is_zero())
            .header_read_timeout(None)
            .max_headers(MAX_HEADERS)
            // Heads past 64 KiB get 431 rather than exhausting memory.
            .max_buf_size(64 * 1024)
    };
}

/// hyper-util's builder for listeners that speak HTTP/1.1 and HTTP/2 (by ALPN, or h2c with
/// prior knowledge), with the listeners' HTTP/1 settings.
pub fn http_builder(
    limits: &ConnLimits,
) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http1_settings!(builder.http1(), limits);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// hyper's HTTP/1 builder with the same settings, for listeners without HTTP/2
/// (`enable_http2: false`): their connections skip the auto builder's protocol detection, and
/// an h2c preface is refused as nginx refuses it there.
pub fn http1_builder(limits: &ConnLimits) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    http1_settings!(builder, limits);
    builder
}

/// How many header fields a request head may have. nginx has no count: a head must fit
/// `large_client_header_buffers` (4 buffers of 8 KiB, so at most 32 KiB), which holds ~500
/// header lines of a typical 64 bytes. hyper's default is 100 (its parser's stack array);
/// above that it allocates the array per request, so the count is kept near what nginx's
/// buffers hold rather than at the bytes' theoretical maximum.
pub const MAX_HEADERS: usize = 512;
