//! How a cluster is written in flags: shards separated by `,`, the replicas of one shard by `/`, in replica
//! order (`docs/replication.md`). `127.0.0.1:7000/127.0.0.1:7002,127.0.0.1:7001/127.0.0.1:7003` is shard 0 on
//! ports 7000 and 7002, shard 1 on 7001 and 7003; an entry without `/` is a shard with one replica.
//! [`resolve_servers`] turns the entries into socket addresses (retrying names of pods not yet in DNS), for the
//! trainer and serving alike.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// The separator between the replicas of one shard in a `--ps` entry.
pub const REPLICA_SEPARATOR: char = '/';

/// One shard's replicas as socket addresses, parsed from one `--ps` entry (`addr[/addr...]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardAddrs(pub Vec<SocketAddr>);

/// A `--ps` entry that is not `addr[/addr...]`.
#[derive(Debug, thiserror::Error)]
pub enum ClusterSpecError {
    /// An empty entry or replica.
    #[error("parameter server entry {entry:?}: empty replica address")]
    Empty {
        /// The entry.
        entry: String,
    },
    /// A replica that is not `ip:port`.
    #[error("parameter server entry {entry:?}: replica {replica:?} is not ip:port ({why})")]
    BadAddr {
        /// The entry.
        entry: String,
        /// The replica.
        replica: String,
        /// The parser's complaint.
        why: String,
    },
    /// The same address twice in one entry.
    #[error("parameter server entry {entry:?}: replica {replica} listed twice")]
    Duplicate {
        /// The entry.
        entry: String,
        /// The repeated address.
        replica: String,
    },
}

/// Splits one `--ps` entry into its replicas' `host:port` strings (trimmed), refusing empty ones.
pub fn split_replicas(entry: &str) -> Result<Vec<&str>, ClusterSpecError> {
    let parts: Vec<&str> = entry.split(REPLICA_SEPARATOR).map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(ClusterSpecError::Empty {
            entry: entry.to_owned(),
        });
    }
    for (i, p) in parts.iter().enumerate() {
        if parts[..i].contains(p) {
            return Err(ClusterSpecError::Duplicate {
                entry: entry.to_owned(),
                replica: (*p).to_owned(),
            });
        }
    }
    Ok(parts)
}

impl FromStr for ShardAddrs {
    type Err = ClusterSpecError;

    fn from_str(s: &str) -> Result<ShardAddrs, ClusterSpecError> {
        split_replicas(s)?
            .into_iter()
            .map(|r| {
                r.parse::<SocketAddr>()
                    .map_err(|e| ClusterSpecError::BadAddr {
                        entry: s.to_owned(),
                        replica: r.to_owned(),
                        why: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(ShardAddrs)
    }
}

impl fmt::Display for ShardAddrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "{REPLICA_SEPARATOR}")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// The replicas of every shard, from parsed `--ps` entries.
pub fn shards(entries: &[ShardAddrs]) -> Vec<Vec<SocketAddr>> {
    entries.iter().map(|e| e.0.clone()).collect()
}

/// Resolves each `--ps` entry (a shard: `host:port`, or its replicas `host:port/host:port...`) to the first
/// address of each replica, in order. Retries names that do not resolve for up to `timeout` (1 s apart); the
/// error names the entry that failed.
pub async fn resolve_servers(
    entries: &[String],
    timeout: Duration,
) -> Result<Vec<Vec<SocketAddr>>, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut shards = Vec::with_capacity(entries.len());
    for shard in entries {
        let replicas = split_replicas(shard.trim()).map_err(|e| e.to_string())?;
        let addrs = resolve_all(&replicas, deadline).await;
        shards.push(addrs.map_err(|e| match replicas.len() {
            1 => e,
            _ => format!("--ps entry {:?}: {e}", shard.trim()),
        })?);
    }
    Ok(shards)
}

async fn resolve_all(
    entries: &[&str],
    deadline: tokio::time::Instant,
) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.trim();
        if let Ok(addr) = entry.parse::<SocketAddr>() {
            out.push(addr);
            continue;
        }
        loop {
            let why = match tokio::net::lookup_host(entry).await {
                Ok(mut addrs) => match addrs.next() {
                    Some(addr) => {
                        out.push(addr);
                        break;
                    }
                    None => "no addresses".to_string(),
                },
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "parameter server {entry:?} does not resolve (expected host:port): {why}"
                ));
            }
            tracing::info!(
                entry,
                why,
                "parameter server name does not resolve yet, retrying"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_with_and_without_replicas() {
        let one: ShardAddrs = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(one.0.len(), 1);
        let two: ShardAddrs = "127.0.0.1:7000/127.0.0.1:7002".parse().unwrap();
        assert_eq!(two.0[1].port(), 7002);
        assert_eq!(two.to_string(), "127.0.0.1:7000/127.0.0.1:7002");
        let v6: ShardAddrs = "[::1]:7000/[::1]:7001".parse().unwrap();
        assert_eq!(v6.0.len(), 2);
    }

    #[test]
    fn bad_entries_name_the_problem() {
        for (bad, what) in [
            ("127.0.0.1:7000/", "empty"),
            ("127.0.0.1:7000/nope", "\"nope\""),
            ("127.0.0.1:7000/127.0.0.1:7000", "twice"),
        ] {
            let e = bad.parse::<ShardAddrs>().unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn ps_entries_resolve_or_name_the_entry() {
        let entries = vec!["127.0.0.1:7000".to_string(), "localhost:7001".to_string()];
        let addrs = resolve_servers(&entries, Duration::ZERO).await.unwrap();
        assert_eq!(addrs[0], vec!["127.0.0.1:7000".parse().unwrap()]);
        assert_eq!(addrs[1][0].port(), 7001);
        assert!(addrs[1][0].ip().is_loopback());
        let replicated = vec!["127.0.0.1:7000/localhost:7002".to_string()];
        let addrs = resolve_servers(&replicated, Duration::ZERO).await.unwrap();
        assert_eq!(addrs[0].len(), 2);
        assert_eq!(addrs[0][1].port(), 7002);
        for bad in [
            "no-such-host.invalid:7000",
            "localhost",
            "127.0.0.1:7000/",
            "127.0.0.1:7000/no-such-host.invalid:7000",
        ] {
            let err = resolve_servers(&[bad.to_string()], Duration::ZERO)
                .await
                .unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }
}
