//! Reading the small JSON objects the runtime folds on every event (a projection's state, a
//! descriptor) by key.
//!
//! `serde_json`'s map (an `IndexMap` here: the crate keeps key order) hashes a key with SipHash
//! before it compares anything. An object of a handful of short keys is found sooner by
//! comparing the keys in turn, and these lookups run for every event of every child.

use serde_json::{Map, Value};

/// The field `key` of `object`.
pub(crate) fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object
        .iter()
        .find_map(|(name, value)| (name == key).then_some(value))
}

/// The field `key` of `object`, to change.
pub(crate) fn field_mut<'a>(
    object: &'a mut Map<String, Value>,
    key: &str,
) -> Option<&'a mut Value> {
    object
        .iter_mut()
        .find_map(|(name, value)| (name == key).then_some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_found_by_its_key_and_a_missing_one_is_none() {
        let serde_json::Value::Object(mut object) =
            serde_json::json!({"settledMs": 5, "active": {"since": 1}})
        else {
            unreachable!("a literal object");
        };
        assert_eq!(field(&object, "settledMs"), Some(&Value::from(5)));
        assert_eq!(field(&object, "settled"), None);
        *field_mut(&mut object, "settledMs").expect("present") = Value::from(7);
        assert_eq!(object["settledMs"], 7);
        assert!(field_mut(&mut object, "pendingTurnStart").is_none());
    }
}
