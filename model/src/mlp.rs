//! [`Mlp`]: a stack of [`Linear`] layers with their activation and gradient buffers.

use super::ensure_len;
use super::linear::Linear;
use super::rng::Rng;

/// A multi-layer perceptron: every layer has a ReLU except possibly the last.
///
/// It owns one output buffer and one output-gradient buffer per layer, grown on demand. Call order for
/// training: [`forward`](Self::forward), write `d loss / d output` into
/// [`output_grad_mut`](Self::output_grad_mut), then [`backward`](Self::backward) with the same input.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
    /// Per layer: its output `[batch x out]` (the first `batch * out` elements are valid).
    out: Vec<Vec<f32>>,
    /// Per layer: `d loss / d output`, same shape.
    dout: Vec<Vec<f32>>,
}

impl Mlp {
    /// Layers `input → sizes[0] → … → sizes[last]`, initialized like the DLRM reference (see
    /// [`Linear`]); `last_relu` says whether the last layer has a ReLU too.
    pub(crate) fn init(input: usize, sizes: &[usize], last_relu: bool, rng: &mut Rng) -> Self {
        let mut fan_in = input;
        let layers = sizes
            .iter()
            .enumerate()
            .map(|(i, &fan_out)| {
                let relu = i + 1 < sizes.len() || last_relu;
                let layer = Linear::init(fan_in, fan_out, relu, rng);
                fan_in = fan_out;
                layer
            })
            .collect();
        Self::from_layers(layers)
    }

    /// An MLP from explicit layers.
    ///
    /// # Panics
    /// If there are no layers or consecutive layer sizes do not chain.
    pub fn from_layers(layers: Vec<Linear>) -> Self {
        assert!(!layers.is_empty(), "mlp needs a layer");
        for pair in layers.windows(2) {
            assert_eq!(
                pair[0].out_dim(),
                pair[1].in_dim(),
                "mlp layer sizes must chain"
            );
        }
        let n = layers.len();
        Self {
            layers,
            out: vec![Vec::new(); n],
            dout: vec![Vec::new(); n],
        }
    }

    /// The layers, input side first.
    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }

    /// The layers, for the optimizer.
    pub(crate) fn layers_mut(&mut self) -> &mut [Linear] {
        &mut self.layers
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.layers[0].in_dim()
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.layers[self.layers.len() - 1].out_dim()
    }

    /// Number of parameters (weights and biases).
    pub fn num_params(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.weight().len() + l.bias().len())
            .sum()
    }

    /// Forward pass over `x[batch x in]`; returns the output `[batch x out]`.
    ///
    /// # Panics
    /// If `x.len() != batch * in_dim`.
    pub fn forward(&mut self, batch: usize, x: &[f32]) -> &[f32] {
        assert_eq!(x.len(), batch * self.in_dim(), "mlp forward: x");
        for (i, layer) in self.layers.iter().enumerate() {
            let (before, rest) = self.out.split_at_mut(i);
            let y = &mut rest[0];
            ensure_len(y, batch * layer.out_dim());
            let input = if i == 0 {
                x
            } else {
                &before[i - 1][..batch * layer.in_dim()]
            };
            layer.forward(batch, input, &mut y[..batch * layer.out_dim()]);
        }
        self.output(batch)
    }

    /// The output of the last [`forward`](Self::forward) with this `batch`.
    pub fn output(&self, batch: usize) -> &[f32] {
        &self.out[self.layers.len() - 1][..batch * self.out_dim()]
    }

    /// Where the caller writes `d loss / d output` (`[batch x out]`) before [`backward`](Self::backward).
    pub fn output_grad_mut(&mut self, batch: usize) -> &mut [f32] {
        self.output_and_grad_mut(batch).1
    }

    /// The output of the last [`forward`](Self::forward) together with the output-gradient buffer, for
    /// callers that compute one from the other (the loss).
    pub fn output_and_grad_mut(&mut self, batch: usize) -> (&[f32], &mut [f32]) {
        let n = self.out_dim();
        let last = self.dout.last_mut().expect("mlp has a layer");
        ensure_len(last, batch * n);
        (
            &self.out[self.out.len() - 1][..batch * n],
            &mut last[..batch * n],
        )
    }

    /// Backward pass: sets every layer's parameter gradients and, when `dx` is given, writes
    /// `d loss / d x` into it. `x` must be the input of the last [`forward`](Self::forward).
    ///
    /// # Panics
    /// If a slice length does not match `batch` and the sizes.
    pub fn backward(&mut self, batch: usize, x: &[f32], mut dx: Option<&mut [f32]>) {
        for i in (0..self.layers.len()).rev() {
            let layer = &mut self.layers[i];
            let (n_in, n_out) = (layer.in_dim(), layer.out_dim());
            let (dbefore, drest) = self.dout.split_at_mut(i);
            let dy = &mut drest[0][..batch * n_out];
            let y = &self.out[i][..batch * n_out];
            if i == 0 {
                layer.backward(batch, x, y, dy, dx.as_deref_mut());
            } else {
                let input = &self.out[i - 1][..batch * n_in];
                let dprev = &mut dbefore[i - 1];
                ensure_len(dprev, batch * n_in);
                layer.backward(batch, input, y, dy, Some(&mut dprev[..batch * n_in]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{check_grad, dot64, rand_vec};
    use super::*;

    #[test]
    fn gradients_match_finite_differences() {
        let mut rng = Rng::new(11);
        let (batch, input) = (4, 5);
        let mut mlp = Mlp::init(input, &[7, 6, 3], false, &mut rng);
        let mut x = rand_vec(&mut rng, batch * input, 1.0);
        let r = rand_vec(&mut rng, batch * 3, 1.0);
        mlp.forward(batch, &x);
        mlp.output_grad_mut(batch).copy_from_slice(&r);
        let mut dx = vec![0.0; x.len()];
        mlp.backward(batch, &x, Some(&mut dx));

        let loss = |mlp: &mut Mlp, x: &[f32]| dot64(mlp.forward(batch, x), &r);
        let (rel, abs) = (1e-2, 2e-3);
        check_grad("x", &dx, 1e-3, rel, abs, |i, d| {
            x[i] += d;
            let l = loss(&mut mlp, &x);
            x[i] -= d;
            l
        });
        for layer in 0..3 {
            let gw = mlp.layers[layer].weight_grad().to_vec();
            check_grad("weight", &gw, 1e-3, rel, abs, |i, d| {
                mlp.layers[layer].params_and_grads().next().unwrap().0[i] += d;
                let l = loss(&mut mlp, &x);
                mlp.layers[layer].params_and_grads().next().unwrap().0[i] -= d;
                l
            });
            let gb = mlp.layers[layer].bias_grad().to_vec();
            check_grad("bias", &gb, 1e-3, rel, abs, |i, d| {
                mlp.layers[layer].params_and_grads().nth(1).unwrap().0[i] += d;
                let l = loss(&mut mlp, &x);
                mlp.layers[layer].params_and_grads().nth(1).unwrap().0[i] -= d;
                l
            });
        }
    }

    #[test]
    fn relu_placement() {
        let mut rng = Rng::new(1);
        let top = Mlp::init(4, &[3, 2, 1], false, &mut rng);
        assert_eq!(
            top.layers().iter().map(Linear::relu).collect::<Vec<_>>(),
            [true, true, false]
        );
        let bottom = Mlp::init(4, &[3, 2], true, &mut rng);
        assert!(bottom.layers().iter().all(Linear::relu));
        assert_eq!(top.num_params(), 4 * 3 + 3 + 3 * 2 + 2 + 2 + 1);
    }

    #[test]
    fn buffers_grow_with_the_batch() {
        let mut rng = Rng::new(2);
        let mut mlp = Mlp::init(3, &[4, 2], false, &mut rng);
        for batch in [1, 5, 2, 9] {
            let x = rand_vec(&mut rng, batch * 3, 1.0);
            assert_eq!(mlp.forward(batch, &x).len(), batch * 2);
            mlp.output_grad_mut(batch).fill(1.0);
            let mut dx = vec![0.0; batch * 3];
            mlp.backward(batch, &x, Some(&mut dx));
        }
    }
}
