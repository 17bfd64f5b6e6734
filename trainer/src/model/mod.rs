//! DLRM dense model (being written).
