//! [`DlrmConfig`]: the sizes of the dense model.

use serde::{Deserialize, Serialize};

use super::ModelError;

/// Sizes of the DLRM dense model. The default is the Criteo Kaggle/Terabyte model of the DLRM reference:
/// 13 dense and 26 sparse features, `d = 16`, bottom MLP 13-512-256-64-16, top MLP 367-512-256-1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlrmConfig {
    /// Number of dense (continuous) input features. Default 13.
    pub num_dense: usize,
    /// Number of sparse (categorical) features, one embedding vector each. Default 26.
    pub num_sparse: usize,
    /// Embedding dimension `d`. Default 16.
    pub emb_dim: usize,
    /// Output size of each bottom-MLP layer; every layer has a ReLU and the last size must equal
    /// `emb_dim`. Default `[512, 256, 64, 16]`.
    pub bottom: Vec<usize>,
    /// Output size of each top-MLP layer; hidden layers have a ReLU, the last has none and must have
    /// size 1 (the logit). Default `[512, 256, 1]`.
    pub top: Vec<usize>,
}

impl Default for DlrmConfig {
    fn default() -> Self {
        Self {
            num_dense: 13,
            num_sparse: 26,
            emb_dim: 16,
            bottom: vec![512, 256, 64, 16],
            top: vec![512, 256, 1],
        }
    }
}

impl DlrmConfig {
    /// Checks every size; the error names the first bad field.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field, reason: String| Err(ModelError::Config { field, reason });
        if self.num_dense == 0 {
            return bad("num_dense", "must be at least 1".into());
        }
        if self.emb_dim == 0 {
            return bad("emb_dim", "must be at least 1".into());
        }
        if self.bottom.is_empty() {
            return bad("bottom", "needs at least one layer".into());
        }
        if self.bottom.contains(&0) {
            return bad("bottom", format!("layer sizes {:?} include 0", self.bottom));
        }
        if self.bottom.last() != Some(&self.emb_dim) {
            return bad(
                "bottom",
                format!(
                    "last layer size {} must equal emb_dim {}",
                    self.bottom[self.bottom.len() - 1],
                    self.emb_dim
                ),
            );
        }
        if self.top.is_empty() {
            return bad("top", "needs at least one layer".into());
        }
        if self.top.contains(&0) {
            return bad("top", format!("layer sizes {:?} include 0", self.top));
        }
        if self.top.last() != Some(&1) {
            return bad(
                "top",
                format!("last layer size {} must be 1", self.top[self.top.len() - 1]),
            );
        }
        Ok(())
    }

    /// Number of vectors the interaction sees: the bottom-MLP output plus one per sparse feature.
    pub fn num_vectors(&self) -> usize {
        self.num_sparse + 1
    }

    /// Number of pairwise dot products, `n (n - 1) / 2` for `n` vectors (351 by default).
    pub fn num_pairs(&self) -> usize {
        let n = self.num_vectors();
        n * (n - 1) / 2
    }

    /// Width of the interaction output, the top MLP's input: `emb_dim + num_pairs` (367 by default).
    pub fn interaction_dim(&self) -> usize {
        self.emb_dim + self.num_pairs()
    }

    /// `(in, out)` of every bottom-MLP layer.
    pub fn bottom_layers(&self) -> Vec<(usize, usize)> {
        layer_dims(self.num_dense, &self.bottom)
    }

    /// `(in, out)` of every top-MLP layer.
    pub fn top_layers(&self) -> Vec<(usize, usize)> {
        layer_dims(self.interaction_dim(), &self.top)
    }

    /// Floating-point operations of one sample's forward plus backward pass, counting multiply-adds as two:
    /// per layer `2 in out` forward and for the weight gradient, plus `2 in out` for the input gradient
    /// (except the first bottom layer, whose input needs none); per interaction pair `2 d` forward and
    /// `4 d` backward. Element-wise work (bias, ReLU, loss, optimizer) is not counted.
    pub fn flops_per_sample(&self) -> f64 {
        let mut flops = 0.0;
        for (i, (fan_in, fan_out)) in self.bottom_layers().into_iter().enumerate() {
            let passes = if i == 0 { 2.0 } else { 3.0 };
            flops += passes * 2.0 * (fan_in * fan_out) as f64;
        }
        for (fan_in, fan_out) in self.top_layers() {
            flops += 3.0 * 2.0 * (fan_in * fan_out) as f64;
        }
        flops + 6.0 * (self.num_pairs() * self.emb_dim) as f64
    }
}

fn layer_dims(input: usize, sizes: &[usize]) -> Vec<(usize, usize)> {
    let mut fan_in = input;
    sizes
        .iter()
        .map(|&fan_out| {
            let dims = (fan_in, fan_out);
            fan_in = fan_out;
            dims
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes() {
        let cfg = DlrmConfig::default();
        cfg.validate().unwrap();
        assert_eq!(cfg.num_pairs(), 351);
        assert_eq!(cfg.interaction_dim(), 367);
        assert_eq!(cfg.top_layers(), vec![(367, 512), (512, 256), (256, 1)]);
        assert_eq!(
            cfg.bottom_layers(),
            vec![(13, 512), (512, 256), (256, 64), (64, 16)]
        );
        let macs_bottom = 13 * 512 + 512 * 256 + 256 * 64 + 64 * 16;
        let macs_top = 367 * 512 + 512 * 256 + 256;
        let want = 6 * (macs_bottom + macs_top) - 2 * 13 * 512 + 6 * 351 * 16;
        assert_eq!(cfg.flops_per_sample(), want as f64);
    }

    #[test]
    fn validate_names_the_field() {
        let field = |cfg: DlrmConfig| match cfg.validate() {
            Err(ModelError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let d = DlrmConfig::default;
        assert_eq!(
            field(DlrmConfig {
                num_dense: 0,
                ..d()
            }),
            "num_dense"
        );
        assert_eq!(field(DlrmConfig { emb_dim: 0, ..d() }), "emb_dim");
        assert_eq!(
            field(DlrmConfig {
                bottom: vec![512, 8],
                ..d()
            }),
            "bottom"
        );
        assert_eq!(
            field(DlrmConfig {
                bottom: vec![],
                ..d()
            }),
            "bottom"
        );
        assert_eq!(
            field(DlrmConfig {
                bottom: vec![0, 16],
                ..d()
            }),
            "bottom"
        );
        assert_eq!(
            field(DlrmConfig {
                top: vec![512, 2],
                ..d()
            }),
            "top"
        );
        assert_eq!(field(DlrmConfig { top: vec![], ..d() }), "top");
        let msg = DlrmConfig {
            bottom: vec![512, 8],
            ..d()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert_eq!(
            msg,
            "invalid config: bottom: last layer size 8 must equal emb_dim 16"
        );
    }

    #[test]
    fn no_sparse_features_is_valid() {
        let cfg = DlrmConfig {
            num_sparse: 0,
            ..DlrmConfig::default()
        };
        cfg.validate().unwrap();
        assert_eq!(cfg.interaction_dim(), 16);
    }
}
