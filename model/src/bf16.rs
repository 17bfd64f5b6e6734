//! bf16 matrix products (mixed precision: bf16 inputs, f32 accumulation and output), on Intel AMX tiles
//! or, on CPUs with AVX512-BF16 but no AMX (AMD Zen 4/5, Intel Cooper Lake), with `vdpbf16ps`.
//!
//! A Sapphire Rapids core multiplies bf16 tiles at about 3 TFLOP/s (measured here with a register-only
//! loop), against about 250 GFLOP/s for the best f32 AVX-512 kernels. `vdpbf16ps` does 32 bf16
//! multiply-adds per instruction against 16 for an f32 FMA, and bf16 operands halve the bytes the
//! products move. The dense step of DLRM is mostly matrix products, so [`Precision::Bf16`](super::Precision)
//! runs them here; everything else (bias, ReLU, interaction, loss, optimizer, the f32 master weights) stays
//! f32.
//!
//! # Layout
//! A product is `c[m x n] = a · b` with `a` packed as bf16 rows `[mp x kp]` and `b` packed in the VNNI
//! layout both instructions read, `[kp / 2][np][2]` (pairs of consecutive `k` side by side), where
//! `mp`, `np`, `kp` are `m`, `n`, `k` rounded up to [`BLOCK`]. Padding is zero, so it adds nothing.
//! The `pack_*` functions round f32 to bf16 (round to nearest even, `vcvtne2ps2bf16`) while packing, from
//! the layouts the model stores: rows, transposed rows, and `[k x n]` or `[n x k]` weights. Both kernels
//! ([`Kernel`]) read the same packed operands: `amx` (tiles) and `avx512` (`vdpbf16ps`, a broadcast bf16
//! pair of `a` against 16 columns' pairs of `b`).
//!
//! # Determinism
//! Every output element sums over `k` in an order fixed by the kernel whatever the caller splits, so results
//! depend on the inputs (and the kernel) alone — but they differ from the f32 path (inputs are rounded to 8
//! bits of mantissa), and in the last bits between the two kernels.
//!
//! # Safety
//! The packers and the `avx512` kernel need AVX512-F/BW/BF16; the `amx` kernel also AMX-TILE, AMX-BF16 and
//! the kernel's permission to use the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`). [`kernel`] checks all
//! of it once, and every entry point asserts it. Tiles are configured at the start of each product and
//! released at its end, so a thread never holds tile state between products.

use std::sync::OnceLock;

/// `m`, `n` and `k` are padded to multiples of this (a 2 x 2 block of 16 x 16 tiles, 32 bf16 per row).
pub(crate) const BLOCK: usize = 32;

/// Elements of one tile: 16 rows of 32 bf16 (1 KiB).
const TILE_ELEMS: usize = 512;

/// Where `a[i][p]` lives in a packed `a` with `kp` padded columns: tile-major, each 16 x 32 tile
/// contiguous (so tile loads read 1 KiB in a row instead of 16 rows a power of two apart, which thrashed a
/// few L1 sets), tiles of a row strip in k order.
#[inline]
fn a_at(i: usize, p: usize, kp: usize) -> usize {
    ((i / 16) * (kp / BLOCK) + p / BLOCK) * TILE_ELEMS + (i % 16) * BLOCK + p % BLOCK
}

/// Where `b[p][j]` lives in a packed `b` with `kp` padded rows: VNNI pairs (`b[2q][j]`, `b[2q + 1][j]`)
/// side by side, tile-major like [`a_at`], each tile 16 pairs of rows x 16 columns.
#[inline]
fn b_at(p: usize, j: usize, kp: usize) -> usize {
    ((j / 16) * (kp / BLOCK) + p / BLOCK) * TILE_ELEMS
        + (p % BLOCK / 2) * BLOCK
        + (j % 16) * 2
        + p % 2
}

/// `x` rounded up to a multiple of [`BLOCK`].
pub(crate) fn pad(x: usize) -> usize {
    x.div_ceil(BLOCK) * BLOCK
}

/// Set (to anything but `0` or empty) to act as if the CPU had no AMX: bf16 then runs on the AVX512-BF16
/// kernel where the CPU has it (to compare the two kernels on one Intel machine).
pub const DISABLE_ENV: &str = "TRAINER_DISABLE_AMX";

/// Set (to anything but `0` or empty) to act as if the CPU had no bf16 kernel at all: for operators who want
/// f32 under `--dense-precision auto`, and for testing the error path.
pub const DISABLE_BF16_ENV: &str = "TRAINER_DISABLE_BF16";

/// Which instructions run the bf16 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AMX tiles (`tdpbf16ps`): Intel Xeon Sapphire Rapids and later.
    Amx,
    /// AVX512-BF16 (`vdpbf16ps`) on zmm registers: AMD Zen 4/5, Intel Cooper Lake, and AMX machines with
    /// [`DISABLE_ENV`] set.
    Avx512Bf16,
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kernel::Amx => "AMX tiles",
            Kernel::Avx512Bf16 => "AVX512-BF16",
        })
    }
}

fn env_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The kernel this process runs bf16 products on: AMX where the CPU has it and the kernel grants the tile
/// state, else AVX512-BF16 where the CPU has it (and AVX512-F/BW), else none; [`DISABLE_ENV`] and
/// [`DISABLE_BF16_ENV`] as documented. Checked once.
pub fn kernel() -> Option<Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if env_set(DISABLE_BF16_ENV) {
            return None;
        }
        let amx_off = env_set(DISABLE_ENV);
        hardware()
            .into_iter()
            .find(|&k| !(amx_off && k == Kernel::Amx))
    })
}

/// Whether bf16 products can run here ([`kernel`] is some).
pub fn available() -> bool {
    kernel().is_some()
}

/// Whether the CPU is Intel's (its CPUID vendor string), for [`crate::bf16_preferred`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn intel() -> bool {
    // CPUID leaf 0 (the vendor) exists on every x86_64 CPU.
    let r = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &vendor == b"GenuineIntel"
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn intel() -> bool {
    false
}

/// Every kernel this CPU can run, best first, whatever the environment says (for tests comparing them).
fn hardware() -> Vec<Kernel> {
    let mut out = Vec::new();
    if avx512_bf16() {
        if amx_granted() {
            out.push(Kernel::Amx);
        }
        out.push(Kernel::Avx512Bf16);
    }
    out
}

/// The kernels tests can run on this machine.
#[cfg(test)]
pub(crate) fn kernels() -> Vec<Kernel> {
    hardware()
}

#[cfg(target_arch = "x86_64")]
fn avx512_bf16() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_bf16() -> bool {
    false
}

/// AMX-TILE and AMX-BF16 on the CPU, and the tile data state granted by the kernel (asked once).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // Leaf 7 is read only when the CPU reports it.
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        let (amx_bf16, amx_tile) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1);
        if !(amx_bf16 && amx_tile) {
            return false;
        }
        // Linux hands out the 8 KiB tile state only on request (arch/x86/include/uapi/asm/prctl.h).
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes the process's permitted xsave features.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        ret == 0
    })
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_granted() -> bool {
    false
}

/// f32 -> bf16, round to nearest even (what `vcvtne2ps2bf16` does; NaN stays NaN). The reference for
/// tests and the scalar tails.
#[cfg(test)]
pub(crate) fn bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if x.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// bf16 -> f32 (exact).
#[cfg(test)]
pub(crate) fn f32_of(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// Packed operands of one thread's products, reused between calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch {
    /// The `a` operand.
    pub(crate) a: Buf,
    /// The `b` operand.
    pub(crate) b: Buf,
}

/// Packed bf16 operands start on a cache line (see `aligned`).
pub(crate) type Buf = super::aligned::Aligned<u16>;

/// Packs `src` (`[m x k]` row-major f32) into `dst[..pad(m) * pad(k)]` as bf16 rows, zero padded: the `a`
/// operand of `src · b`.
///
/// # Panics
/// If the slices are too short or the CPU lacks AVX512-BF16.
pub(crate) fn pack_rows(src: &[f32], m: usize, k: usize, dst: &mut [u16]) {
    assert!(avx512_bf16(), "bf16 packers called without AVX512-BF16");
    assert_eq!(src.len(), m * k, "pack_rows: src");
    assert!(dst.len() >= pad(m) * pad(k), "pack_rows: dst");
    // SAFETY: features checked above; bounds checked above.
    unsafe { x86::pack_rows(src, m, k, dst) }
}

/// Packs `src` (`[k x m]` row-major f32) transposed into `dst[..pad(m) * pad(k)]` as bf16 rows: the `a`
/// operand of `srcᵀ · b`.
///
/// # Panics
/// If the slices are too short or the CPU lacks AVX512-BF16.
pub(crate) fn pack_cols(src: &[f32], k: usize, m: usize, dst: &mut [u16]) {
    assert!(avx512_bf16(), "bf16 packers called without AVX512-BF16");
    assert_eq!(src.len(), k * m, "pack_cols: src");
    assert!(dst.len() >= pad(m) * pad(k), "pack_cols: dst");
    // SAFETY: as above.
    unsafe { x86::pack_cols(src, k, m, dst) }
}

/// Packs `src` (`[k x n]` row-major f32) into `dst[..pad(k) * pad(n)]` in the VNNI layout: the `b` operand
/// of `a · src`.
///
/// # Panics
/// If the slices are too short or the CPU lacks AVX512-BF16.
pub(crate) fn pack_b(src: &[f32], k: usize, n: usize, dst: &mut [u16]) {
    assert!(avx512_bf16(), "bf16 packers called without AVX512-BF16");
    assert_eq!(src.len(), k * n, "pack_b: src");
    assert!(dst.len() >= pad(k) * pad(n), "pack_b: dst");
    // SAFETY: as above.
    unsafe { x86::pack_b(src, k, n, dst) }
}

/// Packs `src` (`[n x k]` row-major f32, e.g. a weight `[out x in]`) transposed into `dst[..pad(k) *
/// pad(n)]` in the VNNI layout: the `b` operand of `a · srcᵀ`.
///
/// # Panics
/// If the slices are too short or the CPU lacks AVX512-BF16.
pub(crate) fn pack_b_transposed(src: &[f32], n: usize, k: usize, dst: &mut [u16]) {
    assert!(avx512_bf16(), "bf16 packers called without AVX512-BF16");
    assert_eq!(src.len(), n * k, "pack_b_transposed: src");
    assert!(dst.len() >= pad(k) * pad(n), "pack_b_transposed: dst");
    // SAFETY: as above.
    unsafe { x86::pack_b_transposed(src, n, k, dst) }
}

/// `c[i * ldc + j] = Σ_p a[i][p] · b[p][j]` for `i < m`, `j < n` (overwritten), with `a` packed by
/// [`pack_rows`]/[`pack_cols`] as `[pad(m) x pad(k)]` and `b` by [`pack_b`]/[`pack_b_transposed`] as
/// `[pad(k) x pad(n)]`, on this process's [`kernel`].
///
/// # Panics
/// If a slice is too short or no kernel is [`available`].
pub(crate) fn gemm(m: usize, n: usize, k: usize, a: &[u16], b: &[u16], c: &mut [f32], ldc: usize) {
    let kernel = kernel().expect("bf16 gemm called without a bf16 kernel");
    gemm_on(kernel, m, n, k, a, b, c, ldc)
}

/// [`gemm`] on a given kernel (tests compare the two on one machine).
///
/// # Panics
/// If a slice is too short or the CPU cannot run `kernel`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_on(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: &[u16],
    b: &[u16],
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        hardware().contains(&kernel),
        "bf16 gemm: this CPU cannot run {kernel}"
    );
    let (mp, np, kp) = (pad(m), pad(n), pad(k));
    assert!(a.len() >= mp * kp, "gemm: a");
    assert!(b.len() >= kp * np, "gemm: b");
    assert!(ldc >= n, "gemm: ldc");
    debug_assert!(
        (a.as_ptr() as usize).is_multiple_of(64) && (b.as_ptr() as usize).is_multiple_of(64),
        "gemm: packed operands must start on a cache line (use `Buf`)"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= (m - 1) * ldc + n, "gemm: c");
    if k == 0 {
        for row in c.chunks_mut(ldc).take(m) {
            row[..n].fill(0.0);
        }
        return;
    }
    // SAFETY: the CPU runs `kernel` (checked above); every load reads inside `a[..mp * kp]` and
    // `b[..kp * np]`, and stores go to `c` only inside `m x n` (AMX blocks that are not whole go through a
    // local block).
    unsafe {
        match kernel {
            Kernel::Amx => x86::gemm(m, n, kp, a, b, c, ldc),
            Kernel::Avx512Bf16 => x86::gemm_avx512(m, n, kp, a, b, c, ldc),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    pub(super) unsafe fn pack_rows(_: &[f32], _: usize, _: usize, _: &mut [u16]) {
        unreachable!("AMX is x86_64 only")
    }
    pub(super) unsafe fn pack_cols(_: &[f32], _: usize, _: usize, _: &mut [u16]) {
        unreachable!("AMX is x86_64 only")
    }
    pub(super) unsafe fn pack_b(_: &[f32], _: usize, _: usize, _: &mut [u16]) {
        unreachable!("AMX is x86_64 only")
    }
    pub(super) unsafe fn pack_b_transposed(_: &[f32], _: usize, _: usize, _: &mut [u16]) {
        unreachable!("AMX is x86_64 only")
    }
    pub(super) unsafe fn gemm(
        _: usize,
        _: usize,
        _: usize,
        _: &[u16],
        _: &[u16],
        _: &mut [f32],
        _: usize,
    ) {
        unreachable!("AMX is x86_64 only")
    }
    pub(super) use gemm as gemm_avx512;
}

#[cfg(test)]
mod tests;

/// Throughput of the products and packers at the model's shapes, run by hand (release, nothing asserted):
/// `cargo test --release -p trainer --lib model::bf16::perf -- --ignored --nocapture`.
#[cfg(test)]
mod perf;
