//! Criteo input (being written).
