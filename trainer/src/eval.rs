//! Evaluation metrics (being written).
