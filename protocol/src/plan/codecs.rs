//! [`TableCodecs`]: which encoding each table's pulled rows and pushed gradients travel in.

use crate::Encoding;

/// Row encodings per table: of pulled rows and of pushed gradients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCodecs {
    /// `pull[t]`: encoding of table `t`'s pulled rows.
    pub pull: Vec<Encoding>,
    /// `push[t]`: encoding of table `t`'s pushed gradients.
    pub push: Vec<Encoding>,
    /// Push encodings sent without error feedback even when a residual store is given.
    pub no_feedback: Vec<Encoding>,
}

impl TableCodecs {
    /// The same encodings for `tables` tables.
    pub fn uniform(tables: usize, pull: Encoding, push: Encoding) -> TableCodecs {
        TableCodecs {
            pull: vec![pull; tables],
            push: vec![push; tables],
            no_feedback: Vec::new(),
        }
    }

    fn get(list: &[Encoding], t: usize) -> Encoding {
        list.get(t)
            .or(list.last())
            .copied()
            .unwrap_or(Encoding::F32)
    }

    /// Pull encoding of table `t` (the last entry for tables past the list).
    pub fn pull_of(&self, t: usize) -> Encoding {
        Self::get(&self.pull, t)
    }

    /// Push encoding of table `t` (the last entry for tables past the list).
    pub fn push_of(&self, t: usize) -> Encoding {
        Self::get(&self.push, t)
    }

    /// Whether pushes in `encoding` carry error feedback (given a residual store): lossy and not listed in
    /// `no_feedback`.
    pub fn feedback_for(&self, encoding: Encoding) -> bool {
        encoding.is_lossy() && !self.no_feedback.contains(&encoding)
    }
}
