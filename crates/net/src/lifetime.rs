//! How long a connection may wait for its first request and sit idle between requests.

use std::future::poll_fn;
use std::future::Future;
use std::pin::pin;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::HttpService;
use hyper_util::server::graceful::GracefulConnection;
use tokio::time::Instant;

use crate::drain::{Drain, IDLE_GRACE};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A served connection that can be told to finish what it has in flight and close. hyper-util's
/// `GracefulConnection` covers its auto-detecting connections but not hyper's HTTP/1 connection
/// with upgrades, which an HTTP/1-only listener serves (and which `GracefulConnection`, being
/// sealed, cannot be given).
pub trait Graceful: Future {
    fn shut_down_gracefully(self: Pin<&mut Self>);
}

impl<I, B, S, E> Graceful for hyper_util::server::conn::auto::Connection<'_, I, S, E>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        GracefulConnection::graceful_shutdown(self);
    }
}

impl<I, B, S, E> Graceful for hyper_util::server::conn::auto::UpgradeableConnection<'_, I, S, E>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        GracefulConnection::graceful_shutdown(self);
    }
}

impl<I, B, S> Graceful for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    fn shut_down_gracefully(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// nginx's per-connection timers, under APISIX's names (`nginx_config.http.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// `client_header_timeout`: from accept to the end of the first request head. A client
    /// that sends nothing, or only part of the HTTP/2 preface, is closed then.
    pub header_timeout: Duration,
    /// `keepalive_timeout`: a connection with no request in flight is closed after this long
    /// (HTTP/1.1 keep-alive and idle HTTP/2 sessions). 0 turns HTTP/1.1 keep-alive off.
    pub keepalive_timeout: Duration,
    /// `send_timeout`: see [`crate::TimedIo`].
    pub send_timeout: Duration,
}

impl Default for ConnLimits {
    /// APISIX's defaults (`conf/config.yaml.example`).
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
struct Activity {
    born: Instant,
    started: AtomicBool,
    /// Signalled once, by the first request: ends the wait for it.
    first_request: tokio::sync::Notify,
    in_flight: AtomicUsize,
    /// Milliseconds after `born` when the last request in flight finished.
    last_end_ms: AtomicU64,
    /// A request arrived over HTTP/2 (a GOAWAY drains it without racing a request).
    http2: AtomicBool,
    /// Bytes arrived while no request was in flight and no head has completed since: the
    /// start of the next request's head (see [`HeadSignal`]).
    head_bytes: AtomicBool,
}

/// One connection's request activity, shared by its service (which reports each request)
/// and [`ConnWatch::run`] (which closes the connection when a limit passes). Checking is lazy:
/// the watcher wakes at the earliest moment a limit could have passed and looks, so a request
/// costs two atomic updates and a clock read, and no wake-up.
#[derive(Clone, Debug)]
pub struct ConnWatch {
    activity: Arc<Activity>,
    limits: ConnLimits,
    /// The server's drain signal, when it has one.
    drain: Option<Drain>,
}

impl ConnWatch {
    pub fn new(limits: ConnLimits) -> ConnWatch {
        ConnWatch {
            activity: Arc::new(Activity {
                born: Instant::now(),
                started: AtomicBool::new(false),
                first_request: tokio::sync::Notify::new(),
                in_flight: AtomicUsize::new(0),
                last_end_ms: AtomicU64::new(0),
                http2: AtomicBool::new(false),
                head_bytes: AtomicBool::new(false),
            }),
            limits,
            drain: None,
        }
    }

    /// Makes the connection follow `drain` (see [`crate::drain`]): drive it with
    /// [`ConnWatch::serve`] and answer through [`ConnWatch::respond`].
    pub fn with_drain(mut self, drain: &Drain) -> ConnWatch {
        self.drain = Some(drain.clone());
        self
    }

    /// Wraps a response for hyper, keeping the request in flight until its body is done. A
    /// draining HTTP/1.1 connection's response says `Connection: close` so that the client
    /// sends nothing more on it (hyper closes after it).
    pub fn respond<B>(
        &self,
        mut resp: http::Response<B>,
        in_flight: InFlight,
        version: http::Version,
    ) -> http::Response<Tracked<B>> {
        if version == http::Version::HTTP_2 {
            self.activity.http2.store(true, Ordering::Relaxed);
        } else if self.drain.as_ref().is_some_and(Drain::is_draining)
            && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS
        {
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        Tracked::response(resp, in_flight)
    }

    /// Like [`ConnWatch::run`], and when the server drains, shuts the connection down
    /// gracefully: HTTP/2 at once (GOAWAY), HTTP/1.1 once no request is in flight and none came
    /// for [`IDLE_GRACE`] (a busy one is closed by its next `Connection: close` answer). The
    /// server's [`Drain`] counts the connection as open until this returns.
    pub async fn serve<C: Graceful>(&self, conn: C) -> Option<C::Output> {
        let Some(drain) = self.drain.clone() else {
            return self.run(conn).await;
        };
        let _open = drain.enter();
        let mut conn = pin!(conn);
        let mut expired = pin!(Dormant::new(self.expired()));
        let mut quiet = pin!(Dormant::new(self.quiet_while_draining(&drain)));
        let mut shut = false;
        poll_fn(|cx| loop {
            if let Poll::Ready(out) = conn.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            if let Poll::Ready(reason) = expired.as_mut().poll(cx) {
                tracing::debug!("closing connection: {reason}");
                return Poll::Ready(None);
            }
            if shut || quiet.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Quiet while draining: shut down, and poll the connection again at once so it
            // acts on it.
            shut = true;
            conn.as_mut().shut_down_gracefully();
        })
        .await
    }

    /// Resolves when a draining connection can be shut down without racing a request.
    async fn quiet_while_draining(&self, drain: &Drain) {
        drain.started().await;
        let a = &self.activity;
        loop {
            if a.http2.load(Ordering::Relaxed) {
                return;
            }
            let next = if a.in_flight.load(Ordering::Acquire) > 0 {
                // Its answer will say `Connection: close`; look again in case it is kept.
                Instant::now() + IDLE_GRACE
            } else {
                let since = a.born + Duration::from_millis(a.last_end_ms.load(Ordering::Acquire));
                let at = since + IDLE_GRACE;
                if at <= Instant::now() {
                    return;
                }
                at
            };
            tokio::time::sleep_until(next).await;
        }
    }

    /// A request head has arrived: the connection is busy until the returned guard (moved
    /// into the response body with [`Tracked`]) is dropped.
    pub fn begin(&self) -> InFlight {
        let a = &self.activity;
        a.in_flight.fetch_add(1, Ordering::Relaxed);
        if a.head_bytes.load(Ordering::Relaxed) {
            a.head_bytes.store(false, Ordering::Relaxed);
        }
        if !a.started.load(Ordering::Relaxed) {
            a.started.store(true, Ordering::Relaxed);
            a.first_request.notify_one();
        }
        InFlight {
            activity: self.activity.clone(),
        }
    }

    /// Drives `conn` (a hyper connection future) until it ends, or drops it (closing the
    /// socket) when a limit passes: `None` then.
    pub async fn run<F: Future>(&self, conn: F) -> Option<F::Output> {
        let mut conn = pin!(conn);
        let mut expired = pin!(Dormant::new(self.expired()));
        poll_fn(|cx| {
            if let Poll::Ready(out) = conn.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            if let Poll::Ready(reason) = expired.as_mut().poll(cx) {
                tracing::debug!("closing connection: {reason}");
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }

    /// Resolves when the connection should be closed, with the reason.
    async fn expired(&self) -> &'static str {
        let a = &self.activity;
        let first = tokio::time::timeout_at(
            a.born + self.limits.header_timeout,
            a.first_request.notified(),
        );
        if first.await.is_err() && !a.started.load(Ordering::Relaxed) {
            // nginx: "client timed out" while waiting for the request (or h2 preface).
            return "client_header_timeout before the first request";
        }
        let idle = self.limits.keepalive_timeout;
        if idle.is_zero() {
            return std::future::pending().await;
        }
        // The idle period a later request's head was found arriving in (its `last_end_ms`),
        // given client_header_timeout from then.
        let mut head_grace: Option<u64> = None;
        loop {
            let now = Instant::now();
            let next = if a.in_flight.load(Ordering::Acquire) > 0
                || !a.started.load(Ordering::Relaxed)
            {
                // Busy: look again one period later.
                head_grace = None;
                now + idle
            } else {
                let last_end = a.last_end_ms.load(Ordering::Acquire);
                let since = a.born + Duration::from_millis(last_end);
                let deadline = match head_grace {
                    Some(end) if end == last_end => {
                        // nginx: "client timed out" reading a later request's head.
                        return "client_header_timeout on a later request";
                    }
                    _ => since + idle,
                };
                head_grace = None;
                if deadline <= now {
                    // nginx switches from keepalive_timeout to client_header_timeout at a
                    // head's first byte. ferrisix learns of those bytes only here, so the head
                    // gets client_header_timeout from now: never less than nginx gives it.
                    if a.head_bytes.load(Ordering::Relaxed) && !a.http2.load(Ordering::Relaxed) {
                        head_grace = Some(last_end);
                        now + self.limits.header_timeout
                    } else {
                        return "keepalive_timeout with no request in flight";
                    }
                } else {
                    deadline
                }
            };
            tokio::time::sleep_until(next).await;
        }
    }
}

pin_project_lite::pin_project! {
    /// A watchdog future polled only when something it waits on (its timer, its notification)
    /// woke it, not on every poll of the connection it guards: `tokio::select!` polled the
    /// idle and drain watchdogs (their sleeps, a random branch order) on each of a request's
    /// wake-ups, for timers that fire after seconds.
    struct Dormant<F> {
        #[pin]
        inner: F,
        signal: Arc<WakeSignal>,
        waker: Waker,
        // The task waker `signal.task` holds (it holds it until a wake takes it, and a wake
        // sets `woken` first), so a poll by the same task registers nothing again.
        registered: Option<Waker>,
    }
}

/// Set by the watchdog's own waker; passes the wake on to the task that polls it.
struct WakeSignal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for WakeSignal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F> Dormant<F> {
    fn new(inner: F) -> Dormant<F> {
        let signal = Arc::new(WakeSignal {
            // The first poll arms its timers.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Dormant {
            inner,
            waker: Waker::from(signal.clone()),
            signal,
            registered: None,
        }
    }
}

impl<F: Future> Future for Dormant<F> {
    type Output = F::Output;

    /// Polled on each of its connection task's wake-ups, so the usual poll (not woken, the
    /// same task) is one plain load: registering the waker and clearing the flag are locked
    /// read-modify-writes, each a full barrier (`benches/e2e/instructions.py --atomics` counts
    /// them per request).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let woken = this.signal.woken.load(Ordering::Acquire);
        // A wake takes the registered waker (after setting `woken`), so a woken poll registers
        // again, before the flag is cleared; so does a poll from another task.
        let same_task = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if woken || !same_task {
            this.signal.task.register(cx.waker());
            if !same_task {
                *this.registered = Some(cx.waker().clone());
            }
        }
        if !(woken && this.signal.woken.swap(false, Ordering::AcqRel)) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.waker))
    }
}

impl ConnWatch {
    /// The handle the connection's reads report to (see [`crate::TimedIo::with_head_signal`]).
    pub fn head_signal(&self) -> HeadSignal {
        HeadSignal {
            activity: self.activity.clone(),
        }
    }
}

/// Tells a [`ConnWatch`] that bytes arrived while the connection was idle: a later request's
/// head has started, so client_header_timeout, not keepalive_timeout, bounds it. hyper's own
/// per-request header timer would do the same at the price of a boxed timer armed and
/// dropped on every request; this costs an atomic load per read.
#[derive(Clone, Debug)]
pub struct HeadSignal {
    activity: Arc<Activity>,
}

impl HeadSignal {
    #[inline]
    pub(crate) fn bytes_read(&self) {
        let a = &self.activity;
        if a.in_flight.load(Ordering::Relaxed) == 0 && !a.head_bytes.load(Ordering::Relaxed) {
            a.head_bytes.store(true, Ordering::Relaxed);
        }
    }
}

/// A request in flight on a watched connection (see [`ConnWatch::begin`]).
#[derive(Debug)]
pub struct InFlight {
    activity: Arc<Activity>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.activity;
        let ms = a.born.elapsed().as_millis() as u64;
        a.last_end_ms.fetch_max(ms, Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::Release);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request [`InFlight`] until the body is done or dropped.
    #[derive(Debug)]
    pub struct Tracked<B> {
        #[pin]
        body: B,
        in_flight: Option<InFlight>,
    }
}

impl<B> Tracked<B> {
    pub fn new(body: B, in_flight: InFlight) -> Tracked<B> {
        Tracked {
            body,
            in_flight: Some(in_flight),
        }
    }

    /// Wraps `resp`'s body.
    pub fn response(resp: http::Response<B>, in_flight: InFlight) -> http::Response<Tracked<B>> {
        resp.map(|body| Tracked::new(body, in_flight))
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // Done: the connection is idle from now, even if hyper keeps the body a while.
            this.in_flight.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dormant watchdog is polled on its first poll and after its own wakes only, and its
    /// wakes reach the task that polls it.
    #[test]
    fn a_dormant_future_is_polled_only_when_it_was_woken() {
        struct Counted {
            polls: Arc<AtomicUsize>,
            waker: Arc<std::sync::Mutex<Option<Waker>>>,
            done: Arc<AtomicBool>,
        }
        impl Future for Counted {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.polls.fetch_add(1, Ordering::Relaxed);
                *self.waker.lock().unwrap() = Some(cx.waker().clone());
                if self.done.load(Ordering::Relaxed) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        }
        struct Task(AtomicUsize);
        impl Wake for Task {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (polls, inner_waker, done) = (Arc::default(), Arc::default(), Arc::default());
        let mut dormant = pin!(Dormant::new(Counted {
            polls: Arc::clone(&polls),
            waker: Arc::clone(&inner_waker),
            done: Arc::clone(&done),
        }));
        let task = Arc::new(Task(AtomicUsize::new(0)));
        let task_waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        let inner_wake = || inner_waker.lock().unwrap().take().unwrap().wake();

        assert!(dormant.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 1, "the first poll arms it");
        for _ in 0..5 {
            assert!(dormant.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "others' wakes do not reach it"
        );
        inner_wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "its wake reaches the task"
        );
        assert!(dormant.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 2);
        // The wake took the task's waker: the woken poll registered it again.
        inner_wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            2,
            "a second wake reaches it"
        );
        assert!(dormant.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 3);
        // Polled by another task (a connection future moved), its wakes go there.
        let other = Arc::new(Task(AtomicUsize::new(0)));
        let other_waker = Waker::from(other.clone());
        assert!(dormant
            .as_mut()
            .poll(&mut Context::from_waker(&other_waker))
            .is_pending());
        inner_wake();
        assert_eq!(other.0.load(Ordering::Relaxed), 1, "the new task is woken");
        assert_eq!(task.0.load(Ordering::Relaxed), 2, "the old one is not");
        assert!(dormant.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::Relaxed), 4);
        // Back on the first task, which is registered again: the next wake reaches it.
        inner_wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 3);
        done.store(true, Ordering::Relaxed);
        assert!(dormant.as_mut().poll(&mut cx).is_ready());
        assert_eq!(polls.load(Ordering::Relaxed), 5);
    }

    fn limits(header: u64, idle: u64) -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_secs(header),
            keepalive_timeout: Duration::from_secs(idle),
            send_timeout: Duration::from_secs(10),
        }
    }

    /// Issue 8, finding 2: a connection with no request is closed at client_header_timeout.
    #[tokio::test(start_paused = true)]
    async fn silent_connection_is_closed_at_the_header_timeout() {
        let watch = ConnWatch::new(limits(60, 75));
        let started = Instant::now();
        assert!(watch.run(std::future::pending::<()>()).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    /// An idle connection (HTTP/2 session or keep-alive) is closed keepalive_timeout after
    /// its last request finished; one with a request in flight is not.
    #[tokio::test(start_paused = true)]
    async fn idle_is_counted_from_the_last_request() {
        let watch = ConnWatch::new(limits(60, 75));
        let w = watch.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let long = w.begin();
            tokio::time::sleep(Duration::from_secs(200)).await;
            drop(long);
        });
        assert!(watch.run(std::future::pending::<()>()).await.is_none());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(201 + 75) && took <= Duration::from_secs(201 + 76),
            "{took:?}"
        );
    }

    /// The idle limit runs from the first request's end even when it is shorter than the
    /// header limit.
    #[tokio::test(start_paused = true)]
    async fn short_idle_limit_is_not_held_up_by_the_header_limit() {
        let watch = ConnWatch::new(limits(60, 5));
        let w = watch.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let r = w.begin();
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(r);
        });
        assert!(watch.run(std::future::pending::<()>()).await.is_none());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(7) && took <= Duration::from_secs(8),
            "{took:?}"
        );
    }

    /// A later request's head that starts and never ends is closed client_header_timeout
    /// after the idle limit found it arriving, not kept forever; an idle connection without
    /// such bytes is closed at the idle limit.
    #[tokio::test(start_paused = true)]
    async fn a_later_partial_head_is_bounded_by_the_header_timeout() {
        for (partial, expect) in [(true, 5 + 1 + 3), (false, 5 + 1)] {
            let watch = ConnWatch::new(limits(3, 5));
            let signal = watch.head_signal();
            let w = watch.clone();
            let started = Instant::now();
            tokio::spawn(async move {
                let r = w.begin();
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(r);
                tokio::time::sleep(Duration::from_secs(2)).await;
                if partial {
                    signal.bytes_read();
                }
            });
            assert!(watch.run(std::future::pending::<()>()).await.is_none());
            let took = started.elapsed().as_secs();
            assert!(
                took == expect || took == expect + 1,
                "partial {partial}: {took}"
            );
        }
    }

    /// A head that completes within the grace begins a request: the connection lives on.
    #[tokio::test(start_paused = true)]
    async fn a_later_head_that_completes_is_served() {
        let watch = ConnWatch::new(limits(3, 5));
        let signal = watch.head_signal();
        let w = watch.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            drop(w.begin());
            tokio::time::sleep(Duration::from_secs(4)).await;
            signal.bytes_read();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let r = w.begin();
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(r);
        });
        assert!(watch.run(std::future::pending::<()>()).await.is_none());
        // Closed idle 5 s after the second request ended (at 7 s).
        let took = started.elapsed().as_secs();
        assert!((12..=13).contains(&took), "{took}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_connection_is_not_cut() {
        let watch = ConnWatch::new(limits(60, 75));
        assert_eq!(watch.run(async { 7 }).await, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_body_ends_the_request_when_done() {
        use http_body_util::BodyExt;
        let watch = ConnWatch::new(limits(60, 75));
        let body = Tracked::new(
            http_body_util::Full::new(bytes::Bytes::from("x")),
            watch.begin(),
        );
        assert_eq!(watch.activity.in_flight.load(Ordering::Relaxed), 1);
        let mut body = Box::pin(body);
        while body.frame().await.is_some() {}
        assert_eq!(watch.activity.in_flight.load(Ordering::Relaxed), 0);
    }
}
