//! Table configs in a header: each [`TableConfig`] travels as its JSON text, the form people write and
//! servers persist. Its enums are internally tagged (`{"type": "sgd", ...}`), which bincode cannot read back
//! (that needs `deserialize_any`); as text, the one serde form of a config serves files, the store and the
//! wire alike, and a field added later with `#[serde(default)]` reads the same on every path. Configs travel
//! in `RegisterTables`, `Hello` and the first messages of replication and resharding only, never per row.
//!
//! Used as `#[serde(with = "crate::wire::tables")]` on a `Vec<TableConfig>` field.

use embedding::TableConfig;
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Writes `tables` as a sequence of JSON texts.
pub fn serialize<S: Serializer>(tables: &[TableConfig], s: S) -> Result<S::Ok, S::Error> {
    let texts = tables
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<String>, _>>()
        .map_err(S::Error::custom)?;
    texts.serialize(s)
}

/// Reads a sequence of JSON texts, refusing one that is not a table config (the error names it).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TableConfig>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|text| {
            serde_json::from_str(text)
                .map_err(|e| D::Error::custom(format!("table config {text:?}: {e}")))
        })
        .collect()
}
