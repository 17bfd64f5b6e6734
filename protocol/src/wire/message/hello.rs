//! `Hello`: the handshake. A client (the trainer's and serving's [`crate::PsClient`], a server's peer or
//! reshard coordinator, a test) asks a server which shard and replica it is and whether it speaks this
//! [`crate::PROTOCOL_VERSION`]; the `Hello` reply carries the shard index and count, the replica index, the
//! shard-map epoch and the tables. The request has no payload.

use crate::wire::message::Request;
use crate::PROTOCOL_VERSION;

/// The header of a `Hello` in this build's protocol version: the one place a handshake is built.
pub fn request() -> Request {
    Request::Hello {
        version: PROTOCOL_VERSION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speaks_this_version() {
        assert_eq!(
            request(),
            Request::Hello {
                version: PROTOCOL_VERSION
            }
        );
    }
}
