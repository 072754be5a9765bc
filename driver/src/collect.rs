//! A flight's streamed merge read whole (docs/merging.md, "Streamed merges"). A flight's answer
//! is shared by every client waiting on its key and stored in the cache whole, so its merge
//! streams into one buffer instead of to one client: what it holds is the merged answer as it
//! grows, counted in the request's share of the merge memory budget, not every backend's answer
//! and their records besides, as a buffered merge would.

use std::pin::pin;

use bytes::BytesMut;
use futures_util::future::{self, Either};
use pdbmux_core::{Response, ResponseBody, UpstreamFailure};

use crate::host::Bound;
use crate::{MergedBody, Runtime, Streamed};

/// `response` with its streamed merge read whole into its body; the answer as it is when it has
/// no streamed merge. The merge failing, passing its deadline or going over the memory budget
/// before its end answers an error instead (no byte has left: the flight's clients get a whole
/// answer, and an expired entry may still be served in its place).
pub(crate) async fn read_whole<R: Runtime>(
    bound: &Bound<'_, R>,
    mut response: Response,
    streamed: Option<Streamed<R>>,
) -> Response {
    let Some(Streamed::Merged(mut body, deadline)) = streamed else {
        return response;
    };
    let mut whole = BytesMut::new();
    loop {
        let piece = {
            let next = future::poll_fn(|cx| body.poll_next(cx));
            match future::select(pin!(next), pin!(bound.sleep_until(deadline))).await {
                Either::Left((piece, _)) => piece,
                Either::Right(((), _)) => return passed_deadline(&mut body),
            }
        };
        match piece {
            Some(Ok(piece)) => {
                if let Err(UpstreamFailure::OverBudget { scope, limit }) =
                    bound.take_budget(piece.len())
                {
                    bound.observe_budget_refusal(scope);
                    return pdbmux_core::budget::over_budget(scope, limit);
                }
                whole.extend_from_slice(&piece);
            }
            None => break,
            Some(Err(failure)) => {
                return Response::text(
                    http::StatusCode::BAD_GATEWAY,
                    format!("pdbmux: the merged answer could not be completed: {failure}"),
                )
            }
        }
    }
    response.body = ResponseBody::Full(whole.freeze());
    response
}

fn passed_deadline<R: Runtime>(body: &mut MergedBody<R>) -> Response {
    let failure = body.deadline_passed();
    Response::text(
        http::StatusCode::GATEWAY_TIMEOUT,
        format!("pdbmux: the merged answer could not be completed: {failure}"),
    )
}
