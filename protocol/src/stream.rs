//! One frame on a QUIC stream: the thin I/O shell around [`crate::frame`].

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ProtocolError;
use crate::frame::{self, PREFIX_LEN};

/// Writes one frame (header then payload) and finishes the sending side.
pub async fn write_frame<H: Serialize>(
    send: &mut quinn::SendStream,
    header: &H,
    payload: &[u8],
) -> Result<(), ProtocolError> {
    let mut head = Vec::with_capacity(128);
    frame::encode_head(header, payload.len(), &mut head)?;
    if payload.len() <= 4096 {
        head.extend_from_slice(payload);
        send.write_all(&head).await?;
    } else {
        send.write_all(&head).await?;
        send.write_all(payload).await?;
    }
    send.finish()?;
    Ok(())
}

fn map_read(err: quinn::ReadExactError, expected: usize) -> ProtocolError {
    match err {
        quinn::ReadExactError::FinishedEarly(got) => ProtocolError::Truncated { got, expected },
        other => ProtocolError::Read(other),
    }
}

/// Reads one frame; the payload is returned without copying out of the receive buffer.
pub async fn read_frame<H: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    max_frame: u64,
) -> Result<(H, Bytes), ProtocolError> {
    let mut prefix = [0u8; PREFIX_LEN];
    recv.read_exact(&mut prefix)
        .await
        .map_err(|e| map_read(e, PREFIX_LEN))?;
    let p = frame::parse_prefix(&prefix, max_frame)?;
    let mut body = vec![0u8; p.body_len()];
    recv.read_exact(&mut body)
        .await
        .map_err(|e| map_read(e, p.body_len()))?;
    let header = frame::decode_header(&body[..p.header_len as usize])?;
    let payload = Bytes::from(body).slice(p.header_len as usize..);
    Ok((header, payload))
}
