//! Row-major matrix products through the `gemm` crate.
//!
//! Every product of the model (forward, input gradient, weight gradient) goes through [`matmul`], so the
//! choice of strides and of parallelism lives in one place. `gemm` dispatches AVX-512/AVX2/scalar kernels at
//! run time and splits large products over the *current* rayon pool: callers limit the threads by running
//! inside `ThreadPool::install`.

use gemm::Parallelism;

/// Products smaller than this many multiply-adds run on the calling thread: splitting them costs more than
/// it saves (gemm applies its own threshold on top of this one).
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// How a row-major operand is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// As stored.
    N,
    /// Transposed.
    T,
}

/// [`matmul_on`] split over the pool when big enough (tests and benchmarks).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    accumulate: bool,
    a: &[f32],
    op_a: Op,
    b: &[f32],
    op_b: Op,
) {
    matmul_on(true, m, n, k, c, accumulate, a, op_a, b, op_b);
}

/// `c[m x n] = op(a) · op(b)`, or `c += op(a) · op(b)` when `accumulate`.
///
/// All matrices are row-major. `a` is stored `[m x k]` (`Op::N`) or `[k x m]` (`Op::T`); `b` is stored
/// `[k x n]` (`Op::N`) or `[n x k]` (`Op::T`). Split over the current rayon pool only when `parallel` (and the
/// product is big enough); the result does not depend on the split: `gemm` divides rows and columns, never the
/// inner dimension.
///
/// # Panics
/// If a slice length does not match its shape (an internal bug: callers slice their buffers first).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_on(
    parallel: bool,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    accumulate: bool,
    a: &[f32],
    op_a: Op,
    b: &[f32],
    op_b: Op,
) {
    assert_eq!(c.len(), m * n, "matmul: c");
    assert_eq!(a.len(), m * k, "matmul: a");
    assert_eq!(b.len(), k * n, "matmul: b");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    // (row stride, column stride) of each operand as gemm sees it.
    let (a_rs, a_cs) = match op_a {
        Op::N => (k, 1),
        Op::T => (1, m),
    };
    let (b_rs, b_cs) = match op_b {
        Op::N => (n, 1),
        Op::T => (1, k),
    };
    let par = if parallel && m * n * k >= PARALLEL_MIN_MACS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: the asserts above guarantee that every index gemm forms — row * rs + col * cs with
    // row < rows, col < cols — lies inside the corresponding slice; `c` is borrowed mutably and
    // cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], op_a: Op, b: &[f32], op_b: Op) -> Vec<f32> {
        let at = |i: usize, p: usize| match op_a {
            Op::N => a[i * k + p],
            Op::T => a[p * m + i],
        };
        let bt = |p: usize, j: usize| match op_b {
            Op::N => b[p * n + j],
            Op::T => b[j * k + p],
        };
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
            }
        }
        c
    }

    #[test]
    fn all_transpose_combinations_match_naive() {
        let (m, n, k) = (37, 19, 70);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        for op_a in [Op::N, Op::T] {
            for op_b in [Op::N, Op::T] {
                let want = naive(m, n, k, &a, op_a, &b, op_b);
                let mut c = vec![1.0; m * n];
                matmul(m, n, k, &mut c, false, &a, op_a, &b, op_b);
                assert_eq!(c, want, "{op_a:?} {op_b:?}");
                matmul(m, n, k, &mut c, true, &a, op_a, &b, op_b);
                let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
                assert_eq!(c, twice, "accumulate {op_a:?} {op_b:?}");
            }
        }
    }

    #[test]
    fn large_product_in_parallel_matches_naive() {
        let (m, n, k) = (300, 130, 90);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let mut c = vec![0.0; m * n];
        matmul(m, n, k, &mut c, false, &a, Op::T, &b, Op::T);
        assert_eq!(c, naive(m, n, k, &a, Op::T, &b, Op::T));
    }
}
