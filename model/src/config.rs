//! [`DlrmConfig`]: the sizes of the dense model, and [`InteractionConfig`]: how the features interact.

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
    /// Embedding dimension `d`: the bottom MLP's last size and, with the dot interaction, every feature's
    /// dimension. Default 16.
    pub emb_dim: usize,
    /// Per sparse feature, the dimension of its pooled embedding; empty (the default) means `emb_dim` for
    /// every feature. A sample's pooled embeddings are laid out feature after feature
    /// ([`emb_offset`](Self::emb_offset)), [`emb_width`](Self::emb_width) values in all.
    #[serde(default)]
    pub feature_dims: Vec<usize>,
    /// Output size of each bottom-MLP layer; every layer has a ReLU and the last size must equal
    /// `emb_dim`. Default `[512, 256, 64, 16]`.
    pub bottom: Vec<usize>,
    /// Output size of each top-MLP layer; hidden layers have a ReLU, the last has none and must have
    /// size 1 (the logit). Default `[512, 256, 1]`.
    pub top: Vec<usize>,
    /// The interaction between the bottom-MLP output and the embeddings. Default [`InteractionConfig::Dot`].
    #[serde(default)]
    pub interaction: InteractionConfig,
}

/// How the bottom-MLP output `z` and the pooled embeddings `e_1..e_F` interact before the top MLP
/// (docs/model-spec.md, "Interaction").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum InteractionConfig {
    /// DLRM's pairwise dot products: output `[z, e_i . e_j for i > j]` (every feature's dimension must equal
    /// `emb_dim`; see [`Interaction`](super::Interaction)).
    #[default]
    Dot,
    /// DCNv2 low-rank cross layers (TorchRec's `LowRankCrossNet`) over `x0 = [z, e_1, ..., e_F]`; see
    /// [`CrossNet`](super::CrossNet).
    Dcn {
        /// Number of cross layers, at least 1.
        layers: usize,
        /// Rank of each layer's `U V` factorization, at least 1.
        rank: usize,
    },
}

impl Default for DlrmConfig {
    fn default() -> Self {
        Self {
            num_dense: 13,
            num_sparse: 26,
            emb_dim: 16,
            bottom: vec![512, 256, 64, 16],
            top: vec![512, 256, 1],
            feature_dims: Vec::new(),
            interaction: InteractionConfig::Dot,
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
        let dims = &self.feature_dims;
        if !dims.is_empty() && dims.len() != self.num_sparse {
            return bad(
                "feature_dims",
                format!(
                    "{} entries, expected num_sparse {} (or none for emb_dim everywhere)",
                    dims.len(),
                    self.num_sparse
                ),
            );
        }
        if let Some(f) = dims.iter().position(|&d| d == 0) {
            return bad(
                "feature_dims",
                format!("feature {f}: dim 0, must be at least 1"),
            );
        }
        match self.interaction {
            InteractionConfig::Dot => {
                let d = self.emb_dim;
                if let Some(f) = (0..self.num_sparse).find(|&f| self.feature_dim(f) != d) {
                    return bad(
                        "interaction",
                        format!(
                            "dot needs every feature's dim to equal emb_dim {d}: feature {f} has dim {}",
                            self.feature_dim(f)
                        ),
                    );
                }
            }
            InteractionConfig::Dcn { layers, rank } => {
                if layers == 0 {
                    return bad("interaction", "dcn layers 0: must be at least 1".into());
                }
                if rank == 0 {
                    return bad("interaction", "dcn rank 0: must be at least 1".into());
                }
            }
        }
        Ok(())
    }

    /// Dimension of sparse feature `f`'s pooled embedding: `feature_dims[f]`, or `emb_dim` when
    /// `feature_dims` is empty.
    pub fn feature_dim(&self, f: usize) -> usize {
        self.feature_dims.get(f).copied().unwrap_or(self.emb_dim)
    }

    /// Width of one sample's pooled embeddings, the sum of the feature dimensions (`num_sparse x emb_dim`
    /// with uniform dimensions): the row width of the model's `emb` input.
    pub fn emb_width(&self) -> usize {
        (0..self.num_sparse).map(|f| self.feature_dim(f)).sum()
    }

    /// Where feature `f` starts within a sample's row of pooled embeddings (`f x emb_dim` with uniform
    /// dimensions).
    pub fn emb_offset(&self, f: usize) -> usize {
        (0..f).map(|f| self.feature_dim(f)).sum()
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

    /// Width of the interaction output, the top MLP's input: with dot, `emb_dim + num_pairs` (367 by
    /// default); with dcn, `emb_dim + emb_width` (the cross layers keep `x0`'s width).
    pub fn interaction_dim(&self) -> usize {
        match self.interaction {
            InteractionConfig::Dot => self.emb_dim + self.num_pairs(),
            InteractionConfig::Dcn { .. } => self.emb_dim + self.emb_width(),
        }
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
    /// (except the first bottom layer, whose input needs none); with dot, per interaction pair `2 d` forward
    /// and `4 d` backward; with dcn, per cross layer its two products `V` (`[rank x D]`) and `U`
    /// (`[D x rank]`) like layers (both need the input gradient). Element-wise work (bias, ReLU, the cross
    /// layers' products with `x0`, loss, optimizer) is not counted.
    pub fn flops_per_sample(&self) -> f64 {
        let mut flops = 0.0;
        for (i, (fan_in, fan_out)) in self.bottom_layers().into_iter().enumerate() {
            let passes = if i == 0 { 2.0 } else { 3.0 };
            flops += passes * 2.0 * (fan_in * fan_out) as f64;
        }
        for (fan_in, fan_out) in self.top_layers() {
            flops += 3.0 * 2.0 * (fan_in * fan_out) as f64;
        }
        match self.interaction {
            InteractionConfig::Dot => flops + 6.0 * (self.num_pairs() * self.emb_dim) as f64,
            InteractionConfig::Dcn { layers, rank } => {
                let d = self.interaction_dim();
                flops + (layers * 2) as f64 * 3.0 * 2.0 * (d * rank) as f64
            }
        }
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

    /// The DLRM-v2 sizes (MLPerf): 26 features of dim 128, bottom 512-256-128, 3 cross layers of rank 512.
    fn dlrm_v2() -> DlrmConfig {
        DlrmConfig {
            emb_dim: 128,
            bottom: vec![512, 256, 128],
            top: vec![1024, 1024, 512, 256, 1],
            interaction: InteractionConfig::Dcn {
                layers: 3,
                rank: 512,
            },
            ..DlrmConfig::default()
        }
    }

    #[test]
    fn dcn_sizes() {
        let cfg = dlrm_v2();
        cfg.validate().unwrap();
        assert_eq!(cfg.emb_width(), 26 * 128);
        assert_eq!(cfg.interaction_dim(), 27 * 128);
        assert_eq!(cfg.top_layers()[0], (3456, 1024));
        let macs_bottom = 13 * 512 + 512 * 256 + 256 * 128;
        let macs_top = 3456 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256;
        let macs_cross = 3 * 2 * 3456 * 512;
        let want = 6 * (macs_bottom + macs_top + macs_cross) - 2 * 13 * 512;
        assert_eq!(cfg.flops_per_sample(), want as f64);
    }

    #[test]
    fn feature_dims_and_offsets() {
        let cfg = DlrmConfig {
            num_sparse: 3,
            emb_dim: 16,
            feature_dims: vec![8, 32, 4],
            interaction: InteractionConfig::Dcn { layers: 1, rank: 2 },
            ..DlrmConfig::default()
        };
        cfg.validate().unwrap();
        assert_eq!(
            (0..3).map(|f| cfg.feature_dim(f)).collect::<Vec<_>>(),
            [8, 32, 4]
        );
        assert_eq!(
            (0..4).map(|f| cfg.emb_offset(f)).collect::<Vec<_>>(),
            [0, 8, 40, 44]
        );
        assert_eq!((cfg.emb_width(), cfg.interaction_dim()), (44, 60));
        // Uniform: the old layout.
        let uniform = DlrmConfig::default();
        assert_eq!(uniform.emb_width(), 26 * 16);
        assert_eq!(uniform.emb_offset(5), 5 * 16);
        assert_eq!(uniform.feature_dim(25), 16);
    }

    #[test]
    fn feature_and_interaction_errors_name_the_values() {
        let err = |cfg: DlrmConfig| match cfg.validate() {
            Err(e @ ModelError::Config { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let small = || DlrmConfig {
            num_sparse: 3,
            ..DlrmConfig::default()
        };
        let dcn = InteractionConfig::Dcn { layers: 2, rank: 8 };
        assert_eq!(
            err(DlrmConfig {
                feature_dims: vec![16, 16],
                interaction: dcn,
                ..small()
            }),
            "invalid config: feature_dims: 2 entries, expected num_sparse 3 (or none for emb_dim everywhere)"
        );
        assert_eq!(
            err(DlrmConfig {
                feature_dims: vec![16, 0, 16],
                interaction: dcn,
                ..small()
            }),
            "invalid config: feature_dims: feature 1: dim 0, must be at least 1"
        );
        assert_eq!(
            err(DlrmConfig {
                feature_dims: vec![16, 16, 8],
                ..small()
            }),
            "invalid config: interaction: dot needs every feature's dim to equal emb_dim 16: feature 2 has dim 8"
        );
        assert_eq!(
            err(DlrmConfig {
                interaction: InteractionConfig::Dcn { layers: 0, rank: 8 },
                ..small()
            }),
            "invalid config: interaction: dcn layers 0: must be at least 1"
        );
        assert_eq!(
            err(DlrmConfig {
                interaction: InteractionConfig::Dcn { layers: 1, rank: 0 },
                ..small()
            }),
            "invalid config: interaction: dcn rank 0: must be at least 1"
        );
        // Dot with explicit dims equal to emb_dim is fine.
        DlrmConfig {
            feature_dims: vec![16; 3],
            ..small()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn serde_defaults_and_tags() {
        let old = r#"{"num_dense":13,"num_sparse":26,"emb_dim":16,"bottom":[512,256,64,16],"top":[512,256,1]}"#;
        let cfg: DlrmConfig = serde_json::from_str(old).unwrap();
        assert_eq!(cfg, DlrmConfig::default());
        let dcn: DlrmConfig = toml::from_str(
            "num_dense = 13\nnum_sparse = 2\nemb_dim = 4\nfeature_dims = [4, 8]\nbottom = [4]\ntop = [1]\n\
             interaction = { kind = \"dcn\", layers = 3, rank = 16 }\n",
        )
        .unwrap();
        assert_eq!(
            dcn.interaction,
            InteractionConfig::Dcn {
                layers: 3,
                rank: 16
            }
        );
        assert_eq!(dcn.feature_dims, [4, 8]);
        let back: DlrmConfig = toml::from_str(&toml::to_string(&dcn).unwrap()).unwrap();
        assert_eq!(back, dcn);
        let dot: InteractionConfig = toml::from_str("kind = \"dot\"").unwrap();
        assert_eq!(dot, InteractionConfig::Dot);
        assert!(toml::from_str::<InteractionConfig>(
            "kind = \"dcn\"\nlayers = 1\nrank = 2\nfoo = 1"
        )
        .is_err());
        assert!(toml::from_str::<InteractionConfig>("kind = \"dcn\"\nlayers = 1").is_err());
        assert!(toml::from_str::<InteractionConfig>("kind = \"cross\"").is_err());
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
