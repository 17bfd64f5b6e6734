//! One frame on a QUIC stream: the thin I/O shell around [`crate::wire::frame`].

use std::future::Future;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ProtocolError;
use crate::wire::frame::{self, PREFIX_LEN};

/// Writes one frame (header then payload) and finishes the sending side. The payload is handed to QUIC as
/// it is (no copy); a small one is appended to the header so the frame goes out as one chunk.
pub async fn write_frame<H: Serialize>(
    send: &mut quinn::SendStream,
    header: &H,
    payload: Bytes,
) -> Result<(), ProtocolError> {
    write_frame_within(send, header, payload, None).await
}

/// [`write_frame`], failing with [`ProtocolError::Idle`] when the peer accepts no byte of the frame for `idle`
/// (a reader that never reads, whose flow-control window stays shut). `None`: no bound.
pub async fn write_frame_within<H: Serialize>(
    send: &mut quinn::SendStream,
    header: &H,
    payload: Bytes,
    idle: Option<Duration>,
) -> Result<(), ProtocolError> {
    let mut head = Vec::with_capacity(128);
    frame::encode_head(header, payload.len(), &mut head)?;
    let mut chunks = if payload.len() <= 4096 {
        head.extend_from_slice(&payload);
        vec![Bytes::from(head)]
    } else {
        vec![Bytes::from(head), payload]
    };
    let mut rest = &mut chunks[..];
    while !rest.is_empty() {
        // `write_chunks` writes nothing when it does not complete, so a timed-out call loses no bytes.
        let written = within(idle, "write", send.write_chunks(rest)).await??;
        rest = &mut rest[written.chunks..];
    }
    send.finish()?;
    Ok(())
}

/// Runs `step` (one step of progress on a stream) within `idle`, or fails naming what stalled.
pub async fn within<T>(
    idle: Option<Duration>,
    what: &'static str,
    step: impl Future<Output = T>,
) -> Result<T, ProtocolError> {
    match idle {
        None => Ok(step.await),
        Some(idle) => tokio::time::timeout(idle, step)
            .await
            .map_err(|_| ProtocolError::Idle { what, idle }),
    }
}

fn map_read(err: quinn::ReadExactError, expected: usize) -> ProtocolError {
    match err {
        quinn::ReadExactError::FinishedEarly(got) => ProtocolError::Truncated { got, expected },
        other => ProtocolError::Read(other),
    }
}

/// Reads one frame. A body that arrives in one QUIC chunk is returned without a copy; otherwise the chunks are
/// copied once into a buffer of the announced size (never zero-filled first).
pub async fn read_frame<H: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max_frame: u64,
) -> Result<(H, Bytes), ProtocolError> {
    let mut prefix = [0u8; PREFIX_LEN];
    recv.read_exact(&mut prefix)
        .await
        .map_err(|e| map_read(e, PREFIX_LEN))?;
    let p = frame::parse_prefix(&prefix, max_frame)?;
    let body = read_body(recv, p.body_len()).await?;
    let header = frame::decode_header(&body[..p.header_len as usize])?;
    Ok((header, body.slice(p.header_len as usize..)))
}

/// Reads the `len` bytes of a frame's body (header and payload) that follow its prefix: without a copy if
/// they arrive in one QUIC chunk, otherwise copied once into a buffer of `len` bytes (never zero-filled).
/// A stream that ends early is [`ProtocolError::Truncated`].
pub async fn read_body(recv: &mut quinn::RecvStream, len: usize) -> Result<Bytes, ProtocolError> {
    read_body_within(recv, len, None).await
}

/// [`read_body`], failing with [`ProtocolError::Idle`] when no byte arrives for `idle` (a sender that
/// announced a body and stalled). `None`: no bound.
pub async fn read_body_within(
    recv: &mut quinn::RecvStream,
    len: usize,
    idle: Option<Duration>,
) -> Result<Bytes, ProtocolError> {
    let mut first: Option<Bytes> = None;
    let mut acc = BytesMut::new();
    let mut got = 0;
    while got < len {
        let chunk = within(idle, "read", recv.read_chunk(len - got, true))
            .await?
            .map_err(|e| ProtocolError::Read(quinn::ReadExactError::ReadError(e)))?
            .ok_or(ProtocolError::Truncated {
                got: PREFIX_LEN + got,
                expected: PREFIX_LEN + len,
            })?;
        got += chunk.bytes.len();
        match first.take() {
            None if acc.is_empty() => first = Some(chunk.bytes),
            earlier => {
                if acc.is_empty() {
                    acc.reserve(len);
                }
                if let Some(b) = earlier {
                    acc.extend_from_slice(&b);
                }
                acc.extend_from_slice(&chunk.bytes);
            }
        }
    }
    Ok(first.unwrap_or_else(|| acc.freeze()))
}
