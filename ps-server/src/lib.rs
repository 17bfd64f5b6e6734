//! ps-server
