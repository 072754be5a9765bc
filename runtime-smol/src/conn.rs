//! One client connection: HTTP/1.1 with keep-alive, a header-read timeout, and the client's going
//! away noticed while its request is served.
//!
//! Request heads are read here (parsed by `pdbmux_driver::http1`, with httparse) rather than by `async_h1::accept`, whose decoder caps
//! the head at 8 KiB (a larger one drops the connection without an answer, so there could be no
//! 414 or 431 from the core), rebuilds the target through `url::Url` (resolving `..` and
//! re-encoding: the core must judge the raw target), insists on a Host header and HTTP/1.1, and
//! has no public setter for its header timeout. Responses are written by async-h1's encoder
//! (Content-Length or chunked framing, Date); a sealed body (a large cached one, see
//! `pdbmux_sealed`) follows its head through the connection's pipe (`vmsplice`, `splice`: its
//! pages are handed to the socket by reference) instead of through the encoder. pdbmux serves
//! GET only, so request bodies are never read: a declared length is skipped after the answer,
//! anything else closes the connection.

use std::future::Future;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_types::headers::{HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE};
use pdbmux_core::{Response, ResponseBody};
use pdbmux_sealed::SealedSender;
use smol::channel::{Receiver, Sender};
use smol::future::{self, FutureExt};
use smol::io::{AsyncReadExt, AsyncWriteExt, Cursor};
use smol::{Async, Timer};

use pdbmux_driver::http1::{parse_head, Head, Parsed, RequestBody, MAX_HEAD_BYTES};

use crate::body::{Deadlined, MergedReader};
use crate::runtime::{Host, Smol};

/// The driver's answer, with this runtime's held body.
type ClientAnswer = pdbmux_driver::ClientAnswer<Smol>;

/// How long this connection waits on its client: `client_header_timeout` for a request head
/// (and while idle between requests), `client_send_timeout` for each write the client takes no
/// bytes of (nginx's `send_timeout`): a client that stops reading cannot hold its connection,
/// buffers and pipe for ever, and one that takes bytes within every timeout is never cut (the
/// kernel wakes a writer once a third of the socket buffer is free, so "takes bytes" means that).
#[derive(Clone, Copy)]
struct Timeouts {
    header: Duration,
    send: Duration,
}
/// The largest request body skipped to keep a connection open; a larger one closes it.
const MAX_SKIPPED_BODY: u64 = 1024 * 1024;
/// Response bytes gathered per write.
const WRITE_BUFFER: usize = 32 * 1024;
/// How long a closing connection keeps reading what the client still sends, so that closing with
/// unread input (a reset) does not destroy the answer on its way.
const LINGER: Duration = Duration::from_secs(1);

/// What a connection task shares with the listener.
#[derive(Clone)]
pub struct Context {
    /// The estate and upstream clients.
    pub host: Arc<Host>,
    /// Closed when the server starts shutting down.
    pub closing: Receiver<()>,
    /// Held while the connection is open; the listener waits for every clone to drop.
    _open: Sender<()>,
}

impl Context {
    /// The context of every connection; `open` is the sender whose clones the listener waits on.
    pub fn new(host: Arc<Host>, closing: Receiver<()>, open: Sender<()>) -> Context {
        Context {
            host,
            closing,
            _open: open,
        }
    }
}

enum HeadRead {
    Request(Head),
    Refuse(StatusCode, &'static str),
    Closed,
}

/// Serves requests on `stream` until the client closes it, it idles past the header timeout, or
/// the server shuts down.
pub async fn serve(stream: Async<TcpStream>, context: Context) {
    let _open = context.host.metrics().map(|m| m.connection_opened());
    let sent = context.host.metrics().map(|m| m.sent_bytes());
    // The client's address, for the access line of each of its requests.
    let peer = stream.get_ref().peer_addr().ok();
    // Bytes received and not yet consumed (a pipelined next request, a body to skip).
    let mut pending: Vec<u8> = Vec::new();
    // Sends sealed bodies, through pipes it borrows while they hold bytes.
    let mut sender = SealedSender::new();
    // The timeouts current at accept (a reload changes them for new connections).
    let config = context.host.config();
    let timeouts = Timeouts {
        header: config.client_header_timeout,
        send: config.client_send_timeout,
    };
    drop(config);
    loop {
        let head = match read_head(&stream, &mut pending, &context.closing, timeouts.header).await {
            HeadRead::Request(head) => head,
            HeadRead::Refuse(status, why) => {
                // Not read far enough to have its fields: a fresh id, and the peer.
                let mut client = pdbmux_driver::ClientContext::internal();
                client.peer = peer;
                let answer = ClientAnswer::refused_head(&client, None, status, why);
                let _ = write(
                    &stream,
                    &mut sender,
                    answer,
                    timeouts.send,
                    false,
                    true,
                    false,
                )
                .await;
                linger_close(&stream).await;
                return;
            }
            HeadRead::Closed => return,
        };
        let skippable = match head.body {
            RequestBody::None => true,
            RequestBody::Length(n) => n <= MAX_SKIPPED_BODY,
            RequestBody::Unskippable => false,
        };
        let mut client = head.context.clone();
        client.peer = peer;
        let handled = async { Some(context.host.answer(&head.request, &client).await) };
        let gone = async {
            watch_client(&stream, &mut pending).await;
            None
        };
        let Some(answer) = handled.or(gone).await else {
            tracing::debug!(target = %head.request.target, "client went away; request dropped");
            return;
        };
        let keep_alive = head.keep_alive && skippable && !context.closing.is_closed();
        let head_only = head.request.method == http::Method::HEAD;
        let written = write(
            &stream,
            &mut sender,
            answer,
            timeouts.send,
            keep_alive,
            head.http11,
            head_only,
        );
        match written.await {
            Ok(bytes) => {
                if let Some(sent) = &sent {
                    sent.add(bytes);
                }
            }
            Err(error) => {
                tracing::debug!("connection ended: {error}");
                return;
            }
        }
        if !keep_alive {
            if !pending.is_empty() || !matches!(head.body, RequestBody::None) {
                linger_close(&stream).await;
            }
            return;
        }
        if let RequestBody::Length(length) = head.body {
            if skip(&stream, &mut pending, length, timeouts.header)
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// Reads the next request head, waiting at most `timeout`; an idle connection is
/// closed as soon as the server starts shutting down.
async fn read_head(
    stream: &Async<TcpStream>,
    pending: &mut Vec<u8>,
    closing: &Receiver<()>,
    timeout: Duration,
) -> HeadRead {
    let mut timer = Timer::at(Instant::now() + timeout);
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        if !pending.is_empty() {
            match parse_head(pending) {
                Parsed::Complete(head, length) => {
                    pending.drain(..length);
                    return HeadRead::Request(*head);
                }
                Parsed::Invalid(status, why) => return HeadRead::Refuse(status, why),
                Parsed::Partial if pending.len() >= MAX_HEAD_BYTES => {
                    return if pending.contains(&b'\n') {
                        HeadRead::Refuse(
                            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                            "request header fields too large",
                        )
                    } else {
                        HeadRead::Refuse(StatusCode::URI_TOO_LONG, "request target too long")
                    };
                }
                Parsed::Partial => {}
            }
        }
        let idle = pending.is_empty();
        let read = async { Some((&*stream).read(&mut chunk).await) };
        let timed_out = async {
            (&mut timer).await;
            None
        };
        let shut = async {
            if idle {
                let _ = closing.recv().await;
            } else {
                future::pending::<()>().await;
            }
            None
        };
        match read.or(timed_out).or(shut).await {
            Some(Ok(0)) | Some(Err(_)) | None => return HeadRead::Closed,
            Some(Ok(n)) => pending.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Resolves when the client closes its side (or the connection fails) while its request is being
/// served; what it sends meanwhile (a pipelined request) is kept in `pending`.
async fn watch_client(stream: &Async<TcpStream>, pending: &mut Vec<u8>) {
    let mut chunk = vec![0u8; 4 * 1024];
    while pending.len() < MAX_HEAD_BYTES {
        match (&*stream).read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
    // Enough buffered: stop reading (the answer will be written, or fail to be).
    future::pending::<()>().await;
}

/// Reads past a request body of `length` bytes the handler did not need.
async fn skip(
    stream: &Async<TcpStream>,
    pending: &mut Vec<u8>,
    length: u64,
    timeout: Duration,
) -> io::Result<()> {
    let buffered = usize::try_from(length).map_or(pending.len(), |n| n.min(pending.len()));
    pending.drain(..buffered);
    let mut left = length - buffered as u64;
    let mut chunk = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + timeout;
    while left > 0 {
        let want = usize::try_from(left).map_or(chunk.len(), |n| n.min(chunk.len()));
        let read = async { (&*stream).read(&mut chunk[..want]).await };
        let timed_out = async {
            Timer::at(deadline).await;
            Err(io::ErrorKind::TimedOut.into())
        };
        match read.or(timed_out).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => left -= n as u64,
        }
    }
    Ok(())
}

/// Writes an answer with async-h1's encoder. A streamed body that fails (over the byte limit,
/// past its deadline, the backend gone) ends in an error before its last chunk, and the caller
/// closes the connection: the client never sees a clean, truncated end.
async fn write(
    stream: &Async<TcpStream>,
    sender: &mut SealedSender,
    answer: ClientAnswer,
    send_timeout: Duration,
    keep_alive: bool,
    http11: bool,
    head_only: bool,
) -> io::Result<u64> {
    let answer = if http11 {
        answer
    } else {
        // HTTP/1.0 has no chunked framing: read a streamed body whole to give it a length.
        buffered(answer).await
    };
    // The body's `Bytes` (cheap to clone) outlives the answer, which goes into the encoder.
    let full_body = match &answer {
        ClientAnswer::Whole(Response {
            body: ResponseBody::Full(body),
            ..
        }) if !head_only => Some(body.clone()),
        _ => None,
    };
    let wire = to_wire(answer, keep_alive, http11);
    if let Some(sealed) = full_body.as_deref().and_then(pdbmux_sealed::find) {
        return write_sealed(stream, sender, wire, sealed, send_timeout).await;
    }
    let method = if head_only {
        http_types::Method::Head
    } else {
        http_types::Method::Get
    };
    let mut encoder = async_h1::server::Encoder::new(wire, method);
    let mut buffer = vec![0u8; WRITE_BUFFER];
    let mut total = 0;
    loop {
        let mut filled = encoder.read(&mut buffer).await?;
        if filled == 0 {
            break;
        }
        // Gather what is ready at once (the head and a whole body), then write it in one go.
        let mut ended = false;
        while buffer.len() - filled >= 1024 {
            match future::poll_once(encoder.read(&mut buffer[filled..])).await {
                Some(Ok(0)) => {
                    ended = true;
                    break;
                }
                Some(Ok(n)) => filled += n,
                Some(Err(error)) => {
                    write_all(stream, &buffer[..filled], send_timeout).await?;
                    return Err(error);
                }
                None => break,
            }
        }
        write_all(stream, &buffer[..filled], send_timeout).await?;
        total += filled as u64;
        if ended {
            break;
        }
    }
    Ok(total)
}

/// Fails with `TimedOut` when `write` has not completed within `timeout`. Each write given here
/// completes as soon as the client takes some bytes, so this bounds how long it takes none.
///
/// The timer is polled before the write: when it fires, the socket has not once been reported
/// writable for the whole timeout, and that is the end, even if a write tried now would take a
/// few bytes (the kernel may free some buffer without waking a writer). Polling the write first
/// let that last-moment write start a second timeout: a client that stopped reading was held
/// for twice `client_send_timeout`.
async fn within<T>(timeout: Duration, write: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    let expired = async {
        Timer::after(timeout).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no bytes for {timeout:?}"),
        ))
    };
    expired.or(write).await
}

/// Writes all of `bytes`, one `write` (and one send timeout) at a time.
async fn write_all(
    mut stream: &Async<TcpStream>,
    mut bytes: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = within(timeout, stream.write(bytes)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// Writes an answer whose body is sealed (a large cached body, see `pdbmux_sealed`): the head
/// from async-h1's encoder (as for HEAD: the same Content-Length, no body), sent with `MSG_MORE`,
/// then the body through `sender`'s pipe, so its bytes are never copied out of user memory;
/// returns once the pipe is empty.
async fn write_sealed(
    stream: &Async<TcpStream>,
    sender: &mut SealedSender,
    wire: http_types::Response,
    mut sealed: pdbmux_sealed::Sealed<'_>,
    timeout: Duration,
) -> io::Result<u64> {
    let body = sealed.len() as u64;
    let mut head = Vec::new();
    async_h1::server::Encoder::new(wire, http_types::Method::Head)
        .read_to_end(&mut head)
        .await?;
    let mut written = 0;
    while written < head.len() {
        let rest = [io::IoSlice::new(&head[written..])];
        let sent = stream.write_with(|socket| pdbmux_sealed::send_head(socket.as_fd(), &rest));
        let n = within(timeout, sent).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    while !sealed.is_empty() {
        drain(stream, sender, timeout).await?;
        let sent = stream.write_with(|socket| sender.send(socket.as_fd(), sealed));
        let n = within(timeout, sent).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sealed.advance(n);
    }
    drain(stream, sender, timeout).await?;
    Ok(head.len() as u64 + body)
}

/// Sends what `sender`'s pipe still holds, one `splice` (and one send timeout) at a time.
async fn drain(
    stream: &Async<TcpStream>,
    sender: &mut SealedSender,
    timeout: Duration,
) -> io::Result<()> {
    while sender.pending() > 0 {
        let moved = stream.write_with(|socket| sender.flush_some(socket.as_fd()));
        within(timeout, moved).await?;
    }
    Ok(())
}

/// Reads a streamed body whole (for an HTTP/1.0 client); a failure becomes a 502.
async fn buffered(answer: ClientAnswer) -> ClientAnswer {
    let mut body = Vec::new();
    let (response, read) = match answer {
        ClientAnswer::Streamed {
            response,
            body: held,
            check,
            deadline,
        } => {
            let read = Deadlined::new(held, check, deadline)
                .read_to_end(&mut body)
                .await;
            (response, read)
        }
        ClientAnswer::Merged {
            response,
            body: merged,
            deadline,
        } => {
            let read = MergedReader::new(merged, deadline)
                .read_to_end(&mut body)
                .await;
            (response, read)
        }
        ClientAnswer::Whole(_) => return answer,
    };
    match read {
        Ok(_) => ClientAnswer::Whole(Response {
            body: ResponseBody::Full(body.into()),
            ..response
        }),
        Err(error) => ClientAnswer::whole(Response::text(
            StatusCode::BAD_GATEWAY,
            format!("pdbmux: upstream body failed: {error}"),
        )),
    }
}

/// The core's response as an async-h1 (http-types) response.
fn to_wire(answer: ClientAnswer, keep_alive: bool, http11: bool) -> http_types::Response {
    let (response, body) = match answer {
        ClientAnswer::Streamed {
            response,
            body: held,
            check,
            deadline,
        } => {
            let length = held.length().and_then(|n| usize::try_from(n).ok());
            let body = http_types::Body::from_reader(Deadlined::new(held, check, deadline), length);
            (response, body)
        }
        ClientAnswer::Merged {
            response,
            body: merged,
            deadline,
        } => {
            let body = http_types::Body::from_reader(MergedReader::new(merged, deadline), None);
            (response, body)
        }
        ClientAnswer::Whole(response) => {
            // Never `Upstream`: the driver pairs those with their bodies (`ClientAnswer::Streamed`).
            let body = match &response.body {
                ResponseBody::Full(bytes) => full(bytes.clone()),
                ResponseBody::Upstream(_) | ResponseBody::Merged => http_types::Body::empty(),
            };
            (response, body)
        }
    };
    let status = http_types::StatusCode::try_from(response.status.as_u16())
        .unwrap_or(http_types::StatusCode::BadGateway);
    let mut wire = http_types::Response::new(status);
    wire.set_body(body);
    // http-types gives a body a default content type; only the core's headers count.
    wire.remove_header(CONTENT_TYPE);
    copy_headers(&response.headers, &mut wire);
    if !keep_alive {
        wire.insert_header(CONNECTION, "close");
    } else if !http11 {
        wire.insert_header(CONNECTION, "keep-alive");
    }
    wire
}

fn full(bytes: Bytes) -> http_types::Body {
    let length = bytes.len();
    http_types::Body::from_reader(Cursor::new(bytes), Some(length))
}

fn copy_headers(headers: &HeaderMap, wire: &mut http_types::Response) {
    for (name, value) in headers {
        let converted = (
            HeaderName::from_bytes(name.as_str().as_bytes().to_vec()),
            HeaderValue::from_bytes(value.as_bytes().to_vec()),
        );
        match converted {
            (Ok(name), Ok(value)) => wire.append_header(name, value),
            _ => tracing::debug!("dropping response header {name}: its value is not ASCII"),
        }
    }
}

/// Closes the connection after reading (and discarding) what the client still sends, for up to
/// [`LINGER`], so that closing with unread input does not reset the connection under the answer.
async fn linger_close(stream: &Async<TcpStream>) {
    let _ = stream.get_ref().shutdown(Shutdown::Write);
    let mut chunk = vec![0u8; 16 * 1024];
    let drain = async {
        let mut total = 0usize;
        while total < 1024 * 1024 {
            match (&*stream).read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let limit = async {
        Timer::after(LINGER).await;
    };
    drain.or(limit).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_write_the_client_takes_nothing_of_times_out() {
        smol::block_on(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let _silent = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let stream = Async::new(listener.accept().unwrap().0).unwrap();
            let chunk = vec![1u8; 64 * 1024];
            let timeout = Duration::from_millis(300);
            let started = Instant::now();
            // Writes go through until the buffers are full; then one waits, and times out.
            let error = loop {
                if let Err(error) = within(timeout, (&stream).write(&chunk)).await {
                    break error;
                }
            };
            assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
            assert!(started.elapsed() >= timeout);
        });
    }
}
