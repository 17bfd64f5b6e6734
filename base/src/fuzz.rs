//! What the workspace's structured fuzzers share (`protocol/tests/fuzz.rs`, `ps-server/tests/fuzz_handler.rs`):
//! their size and seed from the environment, and the `f32` edge values every fuzzed float should hit.

/// `f32` values a fuzzed field should hit often: signed zeros and ones, NaN, infinities, the smallest normal
/// and a value far below it (a subnormal flush candidate).
pub const F32_EDGES: [f32; 9] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MIN_POSITIVE,
    1e-30,
];

/// The number of inputs: `FUZZ_ITERS` when set (a long run: `FUZZ_ITERS=1000000`), else `default` (what CI
/// runs). Panics naming the variable when it is not a number.
pub fn iters(default: u64) -> u64 {
    env_u64("FUZZ_ITERS").unwrap_or(default)
}

/// The seed of the run: `FUZZ_SEED` when set (to replay a failure, whose message prints it), else a fixed one.
/// Panics naming the variable when it is not a number.
pub fn seed() -> u64 {
    env_u64("FUZZ_SEED").unwrap_or(0x5eed)
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name} = {v:?} is not a number: {e}"),
    }
}
