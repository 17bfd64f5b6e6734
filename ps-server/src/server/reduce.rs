//! Answers a `Reduce` ([`crate::reduce`]): adds the contribution, then waits, off any lock, until the step is
//! finalized by the last rank or by its deadline.

use std::time::Instant;

use bytes::Bytes;
use protocol::wire::message::reduce::{self, ReduceHeader};
use protocol::{ErrorCode, Response};

use crate::metrics as m;
use crate::reduce::{Contribution, Outcome};
use crate::shard::Shard;

/// The reply to a reduce of `header` with `payload`: the sums, or a typed error naming what was wrong.
pub(super) async fn answer(
    shard: &Shard,
    header: ReduceHeader,
    payload: &[u8],
) -> (Response, Bytes) {
    let started = Instant::now();
    let outcome = match contribute_and_wait(shard, &header, payload).await {
        Ok(o) => o,
        Err(message) => {
            let code = ErrorCode::BadRequest;
            metrics::counter!(m::REQUEST_ERRORS_TOTAL, "code" => format!("{code:?}")).increment(1);
            tracing::debug!(%message, "refused reduce");
            return (Response::Error { code, message }, Bytes::new());
        }
    };
    metrics::histogram!(m::REDUCE_WAIT_SECONDS).record(started.elapsed().as_secs_f64());
    metrics::gauge!(m::REDUCE_BYTES).set(shard.reducer().bytes() as f64);
    (
        Response::Reduced {
            header: outcome.header.clone(),
        },
        outcome.encoded(header.encoding),
    )
}

async fn contribute_and_wait(
    shard: &Shard,
    header: &ReduceHeader,
    payload: &[u8],
) -> Result<std::sync::Arc<Outcome>, String> {
    reduce::validate(header).map_err(|e| e.to_string())?;
    let mut values = Vec::new();
    reduce::decode_values("reduce", payload, header.len, header.encoding, &mut values)
        .map_err(|e| e.to_string())?;
    let contribution = shard
        .reducer()
        .contribute(header, values, Instant::now())
        .map_err(|e| e.to_string())?;
    let (mut rx, deadline) = match contribution {
        Contribution::Ready(o) => return Ok(o),
        Contribution::Wait { rx, deadline } => (rx, deadline),
    };
    let finalized = tokio::select! {
        r = rx.wait_for(Option::is_some) => r.ok().and_then(|o| o.clone()),
        _ = tokio::time::sleep_until(deadline.into()) => None,
    };
    match finalized {
        Some(o) => Ok(o),
        // The deadline passed (or the step was dropped with its group): finalize with who arrived.
        None => shard
            .reducer()
            .expire(header.group, header.step, Instant::now().max(deadline))
            .ok_or_else(|| {
                format!(
                    "reduce group {} step {} was dropped while rank {} waited",
                    header.group, header.step, header.rank
                )
            }),
    }
}
