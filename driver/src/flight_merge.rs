//! A cached flight's streamed merge (docs/merging.md, "Streamed merges"). A flight is the one
//! fan-out of a cache key, shared by every client asking for it meanwhile, and its answer is
//! stored whole. Its merge streams like a client's own: written to each of its clients as it
//! comes ([`write_to_clients`]), a copy kept for the cache while it fits; or, when the answer
//! must be whole before anyone gets it (a drilldown filters it, a refresh renews an entry), into
//! one buffer ([`read_whole`]). Either way what the flight holds is the merged answer (or less),
//! counted in the request's share of the memory budget, not every backend's answer and their
//! records besides, as a buffered merge would.

use std::pin::pin;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_channel::mpsc;
use futures_util::future::{self, Either};
use pdbmux_core::{Response, ResponseBody, UpstreamFailure};

use crate::host::Bound;
use crate::merged::SharedPiece;
use crate::{MergedBody, Runtime, StreamFailure};

/// How many pieces a flight's client may be behind before the flight waits for it.
pub(crate) const CLIENT_PIECES: usize = 8;

/// How long a flight waits for one client to take a piece before it lets that client go (its
/// body then ends so that it does not parse): a client that stops reading must not hold the
/// others, whose bodies would otherwise stop with it. A client that cannot take 8 pieces' room
/// in 2 s reads a large answer for hours anyway.
const CLIENT_STALL: Duration = Duration::from_secs(2);

/// The next piece of `body`, or the failure its deadline passing is.
async fn next_piece<R: Runtime>(
    bound: &Bound<'_, R>,
    body: &mut MergedBody<R>,
    deadline: Instant,
) -> Option<Result<Bytes, (StreamFailure, http::StatusCode)>> {
    let piece = {
        let next = future::poll_fn(|cx| body.poll_next(cx));
        match future::select(pin!(next), pin!(bound.sleep_until(deadline))).await {
            Either::Left((piece, _)) => Some(piece),
            Either::Right(((), _)) => None,
        }
    };
    match piece {
        Some(Some(Ok(bytes))) => Some(Ok(bytes)),
        Some(None) => None,
        Some(Some(Err(failure))) => Some(Err((failure, http::StatusCode::BAD_GATEWAY))),
        None => Some(Err((
            body.deadline_passed(),
            http::StatusCode::GATEWAY_TIMEOUT,
        ))),
    }
}

/// A flight's merge that broke before its end, as the flight's answer: `502` (`504` past the
/// deadline), never stored.
fn broken(failure: &StreamFailure, status: http::StatusCode) -> Response {
    Response::text(
        status,
        format!("pdbmux: the merged answer could not be completed: {failure}"),
    )
}

/// `head` with its streamed merge `body` read whole into its body. The merge failing, passing its
/// deadline or going over the memory budget before its end answers an error instead (no byte has
/// left: the flight's clients get a whole answer, and an expired entry may be served in its
/// place).
pub(crate) async fn read_whole<R: Runtime>(
    bound: &Bound<'_, R>,
    mut head: Response,
    mut body: MergedBody<R>,
    deadline: Instant,
) -> Response {
    let mut whole = BytesMut::new();
    while let Some(piece) = next_piece(bound, &mut body, deadline).await {
        match piece {
            Ok(piece) => {
                if let Err(UpstreamFailure::OverBudget { scope, limit }) =
                    bound.take_budget(piece.len())
                {
                    bound.observe_budget_refusal(scope);
                    return pdbmux_core::budget::over_budget(scope, limit);
                }
                whole.extend_from_slice(&piece);
            }
            Err((failure, status)) => return broken(&failure, status),
        }
    }
    head.body = ResponseBody::Full(whole.freeze());
    head
}

/// Writes `body`, the merge whose head is `head`, to each of `clients` as it comes, and keeps a
/// copy while it is at most `keep` bytes and within the memory budget. Returns the flight's
/// answer for the cache: `head` with the whole copy, `head` as it is (not whole: nothing to
/// store) when the copy was let go, or the error it broke with (each client's body then ends
/// so that it does not parse). A client that leaves is let go; the merge goes on for the others
/// and the copy, and stops once there are neither.
pub(crate) async fn write_to_clients<R: Runtime>(
    bound: &Bound<'_, R>,
    mut head: Response,
    (mut body, deadline): (MergedBody<R>, Instant),
    mut clients: Vec<mpsc::Sender<SharedPiece>>,
    keep: u64,
) -> Response {
    let mut copy = Some(BytesMut::new());
    loop {
        let piece = next_piece(bound, &mut body, deadline).await;
        let (sent, outcome) = match piece {
            Some(Ok(bytes)) => {
                copy = kept(bound, copy, &bytes, keep);
                (SharedPiece::Bytes(bytes), None)
            }
            None => {
                head.body = match copy.take() {
                    Some(copy) => ResponseBody::Full(copy.freeze()),
                    None => ResponseBody::Merged,
                };
                (SharedPiece::End, Some(head.clone()))
            }
            Some(Err((failure, status))) => (
                SharedPiece::Failed(failure.to_string()),
                Some(broken(&failure, status)),
            ),
        };
        let until = deadline.min(bound.now() + CLIENT_STALL);
        let sends = clients
            .iter_mut()
            .map(|client| deliver(bound, client, sent.clone(), until));
        let delivered = future::join_all(sends).await;
        let mut still = delivered.into_iter();
        clients.retain(|_| still.next().unwrap_or(false));
        if let Some(answer) = outcome {
            return answer;
        }
        if clients.is_empty() && copy.is_none() {
            head.body = ResponseBody::Merged;
            return head;
        }
    }
}

/// The copy for the cache with `bytes` added, counted in the request's memory budget; `None`
/// (its bytes given back) once it would be over `keep` or the budget.
fn kept<R: Runtime>(
    bound: &Bound<'_, R>,
    copy: Option<BytesMut>,
    bytes: &Bytes,
    keep: u64,
) -> Option<BytesMut> {
    let mut copy = copy?;
    let fits = (copy.len() + bytes.len()) as u64 <= keep;
    if fits && bound.take_budget(bytes.len()).is_ok() {
        copy.extend_from_slice(bytes);
        return Some(copy);
    }
    // What was taken for it goes back: for a refused piece too (taking counts before it checks).
    let taken = copy.len() + if fits { bytes.len() } else { 0 };
    bound.give_budget(taken);
    None
}

/// Sends `piece` to one client once it has room: `false` when the client left, or had no room
/// by `until` (it is let go).
async fn deliver<R: Runtime>(
    bound: &Bound<'_, R>,
    client: &mut mpsc::Sender<SharedPiece>,
    piece: SharedPiece,
    until: Instant,
) -> bool {
    let room = future::poll_fn(|cx| client.poll_ready(cx));
    let ready = match future::select(pin!(room), pin!(bound.sleep_until(until))).await {
        Either::Left((ready, _)) => ready.is_ok(),
        Either::Right(((), _)) => false,
    };
    ready && client.start_send(piece).is_ok()
}
