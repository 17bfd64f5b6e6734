//! Tests of the cross layers.
