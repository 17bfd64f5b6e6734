//! A structured fuzzer of the frame decoder ([`protocol::wire::frame`]), deterministic from a seed.
//!
//! Inputs: random bytes, valid frames of random requests and responses, and those frames mutated (truncated,
//! bit-flipped, bytes overwritten, inserted or deleted, length fields replaced by boundary values, magic
//! variants), plus valid prefixes followed by random bodies. Invariants checked on every input:
//! - the decoder never panics (a panic prints the seed, iteration and input in hex);
//! - `Ok(None)` only when fewer bytes than the frame announces are present;
//! - `Ok(Some(..))` ranges lie inside the input, the frame respects the cap, the decoded header re-encodes to a
//!   frame that decodes to the same header bytes, and extra bytes after a frame do not change the result;
//! - every strict prefix of a valid frame needs more bytes.
//!
//! CI runs a few thousand inputs; `FUZZ_ITERS=1000000 FUZZ_SEED=n` runs more (BENCHMARKS.md records a run).

use embedding::{EvictionConfig, EvictionPolicy};
use protocol::wire::frame::{self, decode_frame, decode_header, encode_frame, MAGIC, PREFIX_LEN};
use protocol::{
    AdmissionConfig, Encoding, ErrorCode, InitConfig, ProtocolError, Request, Response,
    RowPrecision, TableConfig, TableCount,
};

/// The fuzzer's generator: splitmix64, tiny, fast and good enough to drive a fuzzer reproducibly.
type Rng = base::rng::SplitMix64;

/// `u32` values a fuzzed field should hit often: small counts, the header cap and its neighbour, the top.
const U32_EDGES: [u32; 9] = [
    0,
    1,
    7,
    8,
    255,
    frame::MAX_HEADER_LEN,
    frame::MAX_HEADER_LEN + 1,
    u32::MAX - 1,
    u32::MAX,
];

use base::fuzz::{iters, seed, F32_EDGES};

fn encoding(r: &mut Rng) -> Encoding {
    r.pick(&Encoding::ALL)
}

fn counts(r: &mut Rng) -> Vec<TableCount> {
    (0..r.below(5))
        .map(|_| TableCount {
            table: r.u32_or_edge(&U32_EDGES),
            count: r.u32_or_edge(&U32_EDGES),
            dim: r.u32_or_edge(&U32_EDGES),
        })
        .collect()
}

fn table(r: &mut Rng) -> TableConfig {
    let kinds = TableConfig::every_kind();
    let mut optimizer = kinds[r.below(kinds.len() as u64) as usize].optimizer;
    for p in optimizer.params_mut() {
        *p = r.f32_or_edge(&F32_EDGES);
    }
    let init = if r.chance(2) {
        InitConfig::uniform(r.f32_or_edge(&F32_EDGES))
    } else {
        InitConfig::normal(r.f32_or_edge(&F32_EDGES))
    };
    let name_len = r.below(12) as usize;
    TableConfig {
        id: r.u32_or_edge(&U32_EDGES),
        name: String::from_utf8_lossy(&r.bytes(name_len)).into_owned(),
        dim: r.u32_or_edge(&U32_EDGES) as usize,
        optimizer,
        init,
        seed: r.next_u64(),
        weight_decay: r.f32_or_edge(&F32_EDGES),
        clip_norm: r.f32_or_edge(&F32_EDGES),
        admission: r.chance(2).then(|| AdmissionConfig {
            min_count: r.u32_or_edge(&U32_EDGES),
            width: r.u32_or_edge(&U32_EDGES) as usize,
            depth: r.u32_or_edge(&U32_EDGES) as usize,
        }),
        ttl_secs: r.chance(2).then(|| r.next_u64() >> r.below(64)),
        precision: [RowPrecision::F32, RowPrecision::Bf16, RowPrecision::F16][r.below(3) as usize],
        state_precision: [RowPrecision::F32, RowPrecision::Bf16, RowPrecision::F16]
            [r.below(3) as usize],
        eviction: r.chance(2).then(|| EvictionConfig {
            policy: if r.chance(2) {
                EvictionPolicy::Score
            } else {
                EvictionPolicy::Lfu
            },
            max_rows: r.chance(2).then(|| r.next_u64() >> r.below(64)),
            max_bytes: r.chance(2).then(|| r.next_u64() >> r.below(64)),
            decay_secs: r.chance(2).then(|| r.next_u64() >> r.below(64)),
        }),
    }
}

fn request(r: &mut Rng) -> Request {
    match r.below(8) {
        7 => Request::Score {
            epoch: r.next_u64() >> r.below(64),
            mode: if r.chance(2) {
                protocol::ScoreMode::Add
            } else {
                protocol::ScoreMode::Set
            },
            tables: counts(r),
        },
        6 => Request::PullWithState {
            epoch: r.next_u64() >> r.below(64),
            encoding: encoding(r),
            tables: counts(r),
        },
        5 => Request::Checkpoint {
            dir: "d".repeat(r.below(20) as usize),
            step: r.next_u64(),
            tensors: r.below(2) == 1,
            prune: (r.below(2) == 1).then(|| embedding::ExportPrune {
                max_age_secs: (r.below(2) == 1).then(|| r.next_u64()),
                min_count: (r.below(2) == 1).then(|| r.u32_or_edge(&U32_EDGES)),
                min_score: (r.below(2) == 1).then(|| f32::from_bits(r.u32_or_edge(&U32_EDGES))),
            }),
        },
        0 => Request::Hello {
            version: r.u32_or_edge(&U32_EDGES),
        },
        1 => Request::RegisterTables {
            tables: (0..r.below(3)).map(|_| table(r)).collect(),
        },
        2 => Request::Pull {
            epoch: r.next_u64() >> r.below(64),
            encoding: encoding(r),
            tables: counts(r),
        },
        3 => Request::Push {
            lr_scale: 1.0,
            epoch: r.next_u64() >> r.below(64),
            encoding: encoding(r),
            grad_scale: r.f32_or_edge(&F32_EDGES),
            tables: counts(r),
            id: protocol::wire::message::push::PushId {
                client: r.next_u64(),
                seq: r.next_u64(),
            },
        },
        _ => Request::Flush,
    }
}

fn response(r: &mut Rng) -> Response {
    let codes = [
        ErrorCode::BadRequest,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownTable,
        ErrorCode::Storage,
        ErrorCode::Internal,
    ];
    match r.below(6) {
        5 => Response::PulledWithState {
            encoding: encoding(r),
            tables: counts(r),
            state_lens: (0..r.below(3)).map(|_| r.u32_or_edge(&U32_EDGES)).collect(),
        },
        4 => Response::Checkpointed {
            rows: r.next_u64(),
            dir: "d".repeat(r.below(20) as usize),
        },
        0 => Response::Pulled {
            encoding: encoding(r),
            tables: counts(r),
        },
        1 => Response::Pushed {
            rows: r.next_u64(),
            rejected_nonfinite: r.next_u64() >> 40,
        },
        2 => Response::Hello {
            shard_index: r.u32_or_edge(&U32_EDGES),
            num_shards: r.u32_or_edge(&U32_EDGES),
            epoch: r.next_u64(),
            routing: r.next_u64(),
            tables: (0..r.below(2)).map(|_| table(r)).collect(),
            replica: protocol::wire::message::replicate::ReplicaInfo {
                shard_epoch: r.next_u64(),
                in_sync_backups: r.next_u64(),
                ..protocol::wire::message::replicate::ReplicaInfo::SINGLE
            },
        },
        _ => Response::Error {
            code: codes[r.below(codes.len() as u64) as usize],
            message: "x".repeat(r.below(40) as usize),
        },
    }
}

/// A valid frame: a random header (request or response) and a random payload.
fn valid_frame(r: &mut Rng) -> Vec<u8> {
    let payload_len = if r.chance(8) {
        0
    } else {
        r.below(200) as usize
    };
    let payload = r.bytes(payload_len);
    if r.chance(2) {
        encode_frame(&request(r), &payload).expect("small frames encode")
    } else {
        encode_frame(&response(r), &payload).expect("small frames encode")
    }
}

fn mutate(r: &mut Rng, mut buf: Vec<u8>) -> Vec<u8> {
    for _ in 0..=r.below(3) {
        match r.below(8) {
            0 if !buf.is_empty() => {
                let cut = r.below(buf.len() as u64) as usize;
                buf.truncate(cut);
            }
            1 if !buf.is_empty() => {
                for _ in 0..=r.below(8) {
                    let bit = r.below(buf.len() as u64 * 8) as usize;
                    buf[bit / 8] ^= 1 << (bit % 8);
                }
            }
            2 if !buf.is_empty() => {
                let at = r.below(buf.len() as u64) as usize;
                buf[at] = r.next_u64() as u8;
            }
            3 => {
                let at = r.below(buf.len() as u64 + 1) as usize;
                let extra = r.below(16) as usize;
                let bytes = r.bytes(extra);
                buf.splice(at..at, bytes);
            }
            4 if !buf.is_empty() => {
                let at = r.below(buf.len() as u64) as usize;
                let end = (at + 1 + r.below(16) as usize).min(buf.len());
                buf.drain(at..end);
            }
            5 if buf.len() >= PREFIX_LEN => {
                // Replace a length field by a boundary value.
                let field = if r.chance(2) { 4 } else { 8 };
                buf[field..field + 4].copy_from_slice(&r.u32_or_edge(&U32_EDGES).to_le_bytes());
            }
            6 if buf.len() >= 4 => {
                // Magic variants: another version of ours, or nearby garbage.
                let magic: [u8; 4] = match r.below(3) {
                    0 => *b"PS02",
                    1 => [b'P', b'S', r.next_u64() as u8, r.next_u64() as u8],
                    _ => (MAGIC ^ (1 << r.below(32))).to_le_bytes(),
                };
                buf[..4].copy_from_slice(&magic);
            }
            _ => {
                // Append another frame or junk: trailing bytes must not change the first frame.
                let tail = if r.chance(2) {
                    valid_frame(r)
                } else {
                    let n = r.below(32) as usize;
                    r.bytes(n)
                };
                buf.extend_from_slice(&tail);
            }
        }
    }
    buf
}

/// A valid prefix with random (often inconsistent) lengths, then random bytes.
fn random_prefix_frame(r: &mut Rng) -> Vec<u8> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&MAGIC.to_le_bytes());
    let header_len = if r.chance(2) {
        r.below(64) as u32
    } else {
        r.u32_or_edge(&U32_EDGES)
    };
    let payload_len = if r.chance(2) {
        r.below(64) as u32
    } else {
        r.u32_or_edge(&U32_EDGES)
    };
    buf.extend_from_slice(&header_len.to_le_bytes());
    buf.extend_from_slice(&payload_len.to_le_bytes());
    let body = r.below(160) as usize;
    buf.extend_from_slice(&r.bytes(body));
    buf
}

fn input(r: &mut Rng) -> Vec<u8> {
    match r.below(4) {
        0 => {
            let n = r.below(300) as usize;
            r.bytes(n)
        }
        1 => random_prefix_frame(r),
        _ => {
            let f = valid_frame(r);
            mutate(r, f)
        }
    }
}

/// Checks the decoder's invariants on `buf` for header type `H`.
fn check<H>(buf: &[u8], max_frame: u64)
where
    H: serde::de::DeserializeOwned + serde::Serialize,
{
    match decode_frame::<H>(buf, max_frame) {
        Ok(None) => {
            if buf.len() >= PREFIX_LEN {
                let prefix = frame::parse_prefix(buf[..PREFIX_LEN].try_into().unwrap(), max_frame)
                    .expect("a prefix that decode_frame accepted parses");
                assert!(
                    buf.len() < PREFIX_LEN + prefix.body_len(),
                    "Ok(None) although the whole frame ({} bytes) is present in {} bytes",
                    PREFIX_LEN + prefix.body_len(),
                    buf.len()
                );
            }
        }
        Ok(Some((header, range, used))) => {
            assert!(used <= buf.len(), "consumed {used} of {} bytes", buf.len());
            assert_eq!(range.end, used);
            assert!(range.start >= PREFIX_LEN && range.start <= range.end);
            assert!(used as u64 <= max_frame, "frame of {used} bytes over cap");
            // The header re-encodes into a frame that decodes to the same header bytes.
            let again = encode_frame(&header, &buf[range.clone()]).expect("re-encode");
            let (h2, r2, u2) = decode_frame::<H>(&again, u64::MAX)
                .expect("re-encoded frame decodes")
                .expect("re-encoded frame is complete");
            assert_eq!(&again[r2], &buf[range]);
            assert_eq!(u2, again.len());
            let reencoded = encode_frame(&h2, &[]).unwrap();
            assert_eq!(reencoded, encode_frame(&header, &[]).unwrap());
            // Bytes after a complete frame do not change it.
            let mut longer = buf[..used].to_vec();
            longer.extend_from_slice(&[0xa5; 9]);
            let (_, _, u3) = decode_frame::<H>(&longer, max_frame)
                .expect("frame plus trailing bytes decodes")
                .expect("complete");
            assert_eq!(u3, used);
        }
        Err(e) => {
            // Errors render (messages name values) and never claim to be remote.
            let msg = e.to_string();
            assert!(!msg.is_empty());
            assert!(!matches!(e, ProtocolError::Remote { .. }));
        }
    }
    // The header decoder alone, on any slice.
    let _ = decode_header::<H>(buf);
}

#[test]
fn frame_decoder_survives_structured_fuzzing() {
    let (n, seed) = (iters(200_000), seed());
    let mut r = Rng::new(seed);
    let started = std::time::Instant::now();
    let mut outcomes = [0u64; 3]; // none, some, err
    for i in 0..n {
        let buf = input(&mut r);
        let max_frame = [frame::DEFAULT_MAX_FRAME, 1024, 64, u64::MAX][r.below(4) as usize];
        let result = std::panic::catch_unwind(|| {
            check::<Request>(&buf, max_frame);
            check::<Response>(&buf, max_frame);
        });
        if result.is_err() {
            panic!(
                "seed {seed} iteration {i} max_frame {max_frame}: input {}",
                hex(&buf)
            );
        }
        match decode_frame::<Request>(&buf, max_frame) {
            Ok(None) => outcomes[0] += 1,
            Ok(Some(_)) => outcomes[1] += 1,
            Err(_) => outcomes[2] += 1,
        }
    }
    eprintln!(
        "frame fuzz: {n} inputs (seed {seed}) in {:.2?}: {} need more bytes, {} decoded, {} refused",
        started.elapsed(),
        outcomes[0],
        outcomes[1],
        outcomes[2]
    );
    // The generator must reach every outcome, or the fuzzer is not exploring.
    if n >= 1000 {
        assert!(outcomes.iter().all(|&c| c > 0), "{outcomes:?}");
    }
}

#[test]
fn every_strict_prefix_of_a_valid_frame_needs_more_bytes() {
    let mut r = Rng::new(seed() ^ 1);
    for _ in 0..iters(200_000) / 100 {
        let f = valid_frame(&mut r);
        for cut in 0..f.len() {
            assert!(
                matches!(decode_frame::<Request>(&f[..cut], u64::MAX), Ok(None))
                    || matches!(decode_frame::<Response>(&f[..cut], u64::MAX), Ok(None)),
                "prefix {cut} of {}",
                hex(&f)
            );
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
