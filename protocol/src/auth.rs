//! Who may send what: the role a client certificate names, and which requests each role may send.
//!
//! Every client certificate of a cluster carries exactly one role, as a URI subject alternative name
//! `pstrain:role/<role>` ([`Role::uri`]). A SAN URI rather than an organizational unit: SANs are the part of
//! a certificate that TLS stacks already parse and verify, cert-manager writes them from a plain `uris:` list,
//! they cannot be confused with the human-readable subject (which tools and CAs rewrite), and the same field
//! carries SPIFFE identities in service meshes. A certificate naming no role, or more than one, gets no
//! access ([`Access::NoRole`]).
//!
//! The server decides once per request, at its one dispatch point, with [`Access::authorize`]: the role of
//! the connection against the class of the request ([`RequestKind`]). The table of what each role may send is
//! [`Role::allows`]; `docs/security.md` explains each line.

use std::fmt;
use std::str::FromStr;

use crate::wire::message::{Request, RequestKind};

/// The scheme and path prefix of a role URI in a certificate's subject alternative names.
pub const ROLE_URI_PREFIX: &str = "pstrain:role/";

/// What a client certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// A training job (the Rust trainer, the Python package, load generators): pulls, pushes, prefetches,
    /// its tables, its reduce and dense publications, flushes and checkpoints of its job, failover.
    Trainer,
    /// Online serving (`ps-serve`): the delta sync and reads.
    Serving,
    /// Another parameter server: replication (join, the stream, promotion) and rows moved by a reshard.
    Peer,
    /// An operator's tools (`ps-server reshard`, `ps-server promote`, `ps-audit`): resharding, checkpoints,
    /// flushes, manual promotion, table registration beyond a trainer's limits, and reads.
    Admin,
}

impl Role {
    /// Every role, in a fixed order.
    pub const ALL: [Role; 4] = [Role::Trainer, Role::Serving, Role::Peer, Role::Admin];

    /// The role's name as written in URIs, file names, flags and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Role::Trainer => "trainer",
            Role::Serving => "serving",
            Role::Peer => "peer",
            Role::Admin => "admin",
        }
    }

    /// The URI a certificate of this role carries in its subject alternative names.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.name())
    }

    /// Whether a connection of this role may send a request of `kind`.
    pub fn allows(self, kind: RequestKind) -> bool {
        use RequestKind as K;
        match kind {
            // Discovery: every role needs to know the shard and its map.
            K::Hello | K::GetShardMap => true,
            K::Pull | K::PullWithState => {
                matches!(self, Role::Trainer | Role::Serving | Role::Admin)
            }
            K::Push | K::Prefetch | K::Reduce | K::PublishDense | K::WriteRows | K::Score => {
                self == Role::Trainer
            }
            K::RegisterTables | K::Flush | K::Checkpoint => {
                matches!(self, Role::Trainer | Role::Admin)
            }
            K::SyncDeltas => matches!(self, Role::Serving | Role::Admin),
            K::Join | K::Replicate | K::MoveRows => self == Role::Peer,
            // Clients drive failover (a trainer that cannot reach a primary asks an in-sync backup); peers ask
            // at start; an operator forces a cold start. The backup's own state checks decide.
            K::Promote => matches!(self, Role::Trainer | Role::Peer | Role::Admin),
            K::Reshard => self == Role::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A role name that is none of `trainer`, `serving`, `peer`, `admin`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}, expected trainer, serving, peer or admin")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

/// What a connection may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Its certificate names this role.
    Role(Role),
    /// The server does not authenticate clients (`ps-server --insecure-dev`): everything, as before roles.
    Unauthenticated,
    /// Its certificate names no role, or several, or could not be read: nothing. Says why.
    NoRole(String),
}

impl Access {
    /// The access a verified client certificate (DER) gives: the role its `pstrain:role/...` URI names.
    pub fn of_certificate(der: &[u8]) -> Access {
        match role_of_certificate(der) {
            Ok(role) => Access::Role(role),
            Err(why) => Access::NoRole(why),
        }
    }

    /// The access of a connection whose peer presented `chain` (leaf first), on a server that
    /// authenticates clients; no certificate gives no access.
    pub fn of_chain<C: AsRef<[u8]>>(chain: Option<&[C]>) -> Access {
        match chain.and_then(|c| c.first()) {
            Some(leaf) => Access::of_certificate(leaf.as_ref()),
            None => Access::NoRole("the client presented no certificate".into()),
        }
    }

    /// The label of the `role` dimension of metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Access::Role(r) => r.name(),
            Access::Unauthenticated => "unauthenticated",
            Access::NoRole(_) => "none",
        }
    }

    /// Whether a request of `kind` may be sent on this connection; the refusal names the role and the
    /// request.
    pub fn authorize(&self, kind: RequestKind) -> Result<(), Forbidden> {
        match self {
            Access::Unauthenticated => Ok(()),
            Access::Role(role) if role.allows(kind) => Ok(()),
            Access::Role(role) => Err(Forbidden {
                message: format!(
                    "role {role} may not send {}: it is for {}",
                    kind.name(),
                    allowed_roles(kind)
                ),
            }),
            Access::NoRole(why) => Err(Forbidden {
                message: format!(
                    "{} refused: {why} (client certificates must carry one subject alternative name URI \
                     {ROLE_URI_PREFIX}<trainer|serving|peer|admin>; `ps-server certs init` issues them)",
                    kind.name()
                ),
            }),
        }
    }
}

impl Access {
    /// [`Access::authorize`] of the request's kind, and what a field adds: a forced `Promote` (an
    /// operator's cold start) is for the admin role only.
    pub fn authorize_request(&self, req: &Request) -> Result<(), Forbidden> {
        self.authorize(req.kind())?;
        match (req, self) {
            (Request::Promote { force: true, .. }, Access::Role(role)) if *role != Role::Admin => {
                Err(Forbidden {
                    message: format!(
                        "role {role} may not send a forced Promote (a cold start): it is for the admin role"
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

/// A request the connection's role may not send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Forbidden {
    /// Names the role and the request.
    pub message: String,
}

/// The roles that may send `kind`, for messages: "admin", "trainer or admin", ...
fn allowed_roles(kind: RequestKind) -> String {
    let names: Vec<&str> = Role::ALL
        .into_iter()
        .filter(|r| r.allows(kind))
        .map(Role::name)
        .collect();
    match names.split_last() {
        None => "no role".into(),
        Some((last, [])) => format!("the {last} role"),
        Some((last, rest)) => format!("the {} or {last} roles", rest.join(", ")),
    }
}

/// The one role named by a certificate's `pstrain:role/...` SAN URIs.
fn role_of_certificate(der: &[u8]) -> Result<Role, String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let san = cert.subject_alternative_name().map_err(|e| {
        format!("the client certificate's subject alternative names do not parse: {e}")
    })?;
    let mut roles = Vec::new();
    for name in san.iter().flat_map(|s| s.value.general_names.iter()) {
        if let GeneralName::URI(uri) = name {
            if let Some(role) = uri.strip_prefix(ROLE_URI_PREFIX) {
                roles.push(
                    role.parse::<Role>()
                        .map_err(|e| format!("the client certificate's URI {uri:?}: {e}"))?,
                );
            }
        }
    }
    let subject = cert.subject().to_string();
    match roles.as_slice() {
        [one] => Ok(*one),
        [] => Err(format!("the client certificate ({subject}) names no role")),
        many => Err(format!(
            "the client certificate ({subject}) names {} roles ({}), expected one",
            many.len(),
            many.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with_uris(uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI(rcgen::string::Ia5String::try_from(*u).unwrap()))
            .collect();
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_role_uri_gives_that_role() {
        for role in Role::ALL {
            let der = cert_with_uris(&["spiffe://example/x", &role.uri()]);
            assert_eq!(Access::of_certificate(&der), Access::Role(role));
        }
    }

    #[test]
    fn no_role_or_two_roles_or_an_unknown_one_give_nothing() {
        for uris in [
            vec![],
            vec!["pstrain:role/trainer", "pstrain:role/admin"],
            vec!["pstrain:role/root"],
        ] {
            let access = Access::of_certificate(&cert_with_uris(&uris));
            let Access::NoRole(why) = &access else {
                panic!("{uris:?}: {access:?}");
            };
            let refused = access.authorize(RequestKind::Hello).unwrap_err();
            assert!(refused.message.contains(why), "{refused}");
        }
        assert!(matches!(
            Access::of_certificate(b"not a certificate"),
            Access::NoRole(_)
        ));
        assert!(matches!(
            Access::of_chain::<Vec<u8>>(None),
            Access::NoRole(_)
        ));
    }

    #[test]
    fn the_table_of_roles() {
        use RequestKind as K;
        let t = Access::Role(Role::Trainer);
        let s = Access::Role(Role::Serving);
        let p = Access::Role(Role::Peer);
        let a = Access::Role(Role::Admin);
        for k in [
            K::Push,
            K::Prefetch,
            K::Reduce,
            K::PublishDense,
            K::WriteRows,
            K::Score,
        ] {
            assert!(t.authorize(k).is_ok());
            for other in [&s, &p, &a] {
                assert!(other.authorize(k).is_err(), "{other:?} {k:?}");
            }
        }
        for k in [K::Join, K::Replicate, K::MoveRows] {
            assert!(p.authorize(k).is_ok());
            for other in [&t, &s, &a] {
                assert!(other.authorize(k).is_err(), "{other:?} {k:?}");
            }
        }
        assert!(a.authorize(K::Reshard).is_ok());
        let refused = t.authorize(K::Reshard).unwrap_err().message;
        assert_eq!(
            refused,
            "role trainer may not send Reshard: it is for the admin role"
        );
        assert!(s.authorize(K::SyncDeltas).is_ok() && t.authorize(K::SyncDeltas).is_err());
        assert!(s
            .authorize(K::Push)
            .unwrap_err()
            .message
            .contains("the trainer role"));
        assert!(p.authorize(K::Pull).is_err());
        for k in RequestKind::ALL {
            assert!(Access::Unauthenticated.authorize(k).is_ok());
            assert!(a.authorize(K::Hello).is_ok() && t.authorize(K::GetShardMap).is_ok());
            // Every request is allowed to some role, and none to all but discovery.
            assert!(Role::ALL.into_iter().any(|r| r.allows(k)), "{k:?}");
        }
    }

    #[test]
    fn a_forced_promote_is_for_admins() {
        let force = Request::Promote {
            shard_epoch: 0,
            force: true,
        };
        let plain = Request::Promote {
            shard_epoch: 0,
            force: false,
        };
        assert!(Access::Role(Role::Admin).authorize_request(&force).is_ok());
        for role in [Role::Trainer, Role::Peer] {
            assert!(Access::Role(role).authorize_request(&plain).is_ok());
            let e = Access::Role(role).authorize_request(&force).unwrap_err();
            assert!(e.message.contains("forced Promote"), "{e}");
        }
        assert!(Access::Role(Role::Serving)
            .authorize_request(&plain)
            .is_err());
    }

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(role.name().parse::<Role>().unwrap(), role);
        }
        assert!("root".parse::<Role>().is_err());
    }
}
