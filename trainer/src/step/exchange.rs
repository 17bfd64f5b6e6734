//! Requests to the parameter servers of one batch, sent in parallel: embedding pulls with per-table
//! encodings, dense pulls, and a batch's pushes.

use std::sync::Arc;

use bytes::Bytes;
use protocol::transport::Dialer;
use protocol::{Encoding, ProtocolError, PsClient, PulledState, TableCount};
use tokio::task::JoinSet;

use protocol::plan::PartRequest;

/// Replies as `(request index or server, rows)`.
pub type Replies = Vec<(usize, Bytes)>;

/// A push request: `(server, encoding, loss scale, table counts, payload)`.
pub type PushRequest = (usize, Encoding, f32, Vec<TableCount>, Bytes);

/// Replies to embedding pulls as `(request index, rows and state)`; the state is empty unless pulled with it.
pub type PartReplies = Vec<(usize, PulledState)>;

/// Sends embedding pulls with per-table encodings in parallel (with each row's optimizer state if
/// `with_state`); the replies by request index (see [`protocol::plan::Plan::scatter_replies`]).
pub async fn pull_parts<D: Dialer>(
    client: &Arc<PsClient<D>>,
    requests: Vec<PartRequest>,
    with_state: bool,
) -> Result<PartReplies, ProtocolError> {
    let mut set = JoinSet::new();
    for (i, r) in requests.into_iter().enumerate() {
        let client = client.clone();
        set.spawn(async move {
            let ids = Bytes::from(r.payload);
            let reply = if with_state {
                client
                    .pull_with_state(r.server, r.encoding, r.counts, ids)
                    .await?
            } else {
                PulledState {
                    rows: client.pull(r.server, r.encoding, r.counts, ids).await?,
                    state: Bytes::new(),
                    state_lens: Vec::new(),
                }
            };
            Ok((i, reply))
        });
    }
    collect(set).await
}

/// Sends `requests` as pulls in parallel; the replies as `(server, rows)`.
pub async fn pull_all<D: Dialer>(
    client: &Arc<PsClient<D>>,
    encoding: Encoding,
    requests: Vec<(usize, Vec<TableCount>, Bytes)>,
) -> Result<Replies, ProtocolError> {
    let mut set = JoinSet::new();
    for (s, counts, ids) in requests {
        let client = client.clone();
        set.spawn(async move { client.pull(s, encoding, counts, ids).await.map(|b| (s, b)) });
    }
    collect(set).await
}

/// Sends `requests` as pushes in parallel; returns the rows applied and the rows rejected as non-finite.
pub async fn push_all<D: Dialer>(
    client: &Arc<PsClient<D>>,
    requests: Vec<PushRequest>,
) -> Result<(u64, u64), ProtocolError> {
    let mut set = JoinSet::new();
    for (s, encoding, scale, counts, payload) in requests {
        let client = client.clone();
        set.spawn(async move { client.push(s, encoding, scale, counts, payload).await });
    }
    let (mut applied, mut rejected) = (0, 0);
    while let Some(r) = set.join_next().await {
        let (a, r) = r.expect("push task panicked")?;
        applied += a;
        rejected += r;
    }
    Ok((applied, rejected))
}

async fn collect<T: Send + 'static>(
    mut set: JoinSet<Result<(usize, T), ProtocolError>>,
) -> Result<Vec<(usize, T)>, ProtocolError> {
    let mut out = Vec::with_capacity(set.len());
    while let Some(joined) = set.join_next().await {
        out.push(joined.expect("pull task panicked")?);
    }
    Ok(out)
}
