//! Provides [`EncodedRow`]: a projection-cache row as the stores keep it, JSON bytes that are
//! known to be JSON.

use serde::Serialize;

use crate::error::{ErrorCode, Result, SubagentError};

/// A projection-cache row encoded as JSON, as [`super::SessionPersistence::cache_put_encoded`]
/// writes it: made by encoding a value, or from bytes checked to be JSON, so a store keeps the
/// bytes as they are and reads them back as the value they encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRow(Vec<u8>);

impl EncodedRow {
    /// Encodes `row`.
    ///
    /// # Errors
    /// `INVALID_PROJECTION` when `row` does not encode as JSON (a map with keys that are not
    /// strings, a path that is not UTF-8).
    pub fn encode(row: &impl Serialize) -> Result<Self> {
        serde_json::to_vec(row).map(Self).map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidProjection,
                format!("a projection cache row does not encode: {error}"),
            )
            .with_source(error)
        })
    }

    /// The row `bytes` hold.
    ///
    /// # Errors
    /// `INVALID_PROJECTION` when `bytes` are not one JSON value.
    pub fn from_json(bytes: Vec<u8>) -> Result<Self> {
        match serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
            Ok(_) => Ok(Self(bytes)),
            Err(error) => Err(SubagentError::new(
                ErrorCode::InvalidProjection,
                format!("a projection cache row is not JSON: {error}"),
            )
            .with_source(error)),
        }
    }

    /// The bytes a store kept for a row it was handed encoded: JSON when they were written,
    /// checked by whoever decodes them.
    pub(crate) fn stored(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }

    /// The JSON bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The JSON bytes, to keep.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_json_whichever_way_it_is_made() {
        let encoded = EncodedRow::encode(&serde_json::json!({"rows": {}})).expect("encodes");
        assert_eq!(encoded.as_bytes(), br#"{"rows":{}}"#);
        assert_eq!(
            EncodedRow::from_json(br#"{"rows":{}}"#.to_vec()).expect("JSON"),
            encoded
        );
        for bytes in [&b"{rows"[..], b"", b"{} {}", b"\xff"] {
            let refused = EncodedRow::from_json(bytes.to_vec()).expect_err("not JSON");
            assert_eq!(refused.code(), ErrorCode::InvalidProjection, "{bytes:?}");
        }
    }
}
