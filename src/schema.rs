//! Provides [`ObjectSchema`]: the object-rooted JSON Schema subset that structured output
//! enforces, and value validation against it.
//!
//! # The subset
//! Constraint keywords: `type`, `oneOf`, `properties`, `required`, `additionalProperties`,
//! `items`, `enum`, `const`. Annotations: `description` and `title` (strings), `default` and
//! `examples` (lossless JSON). Every other keyword is refused (`$ref`, `anyOf`, `pattern`,
//! `minimum`, ...), and so are:
//!
//! - `type` other than one of `object`, `array`, `string`, `number`, `integer`, `boolean`,
//!   `null` (type arrays included), and `type` beside `oneOf`;
//! - structural keywords on a node with neither `type` nor `oneOf`;
//! - `oneOf` with fewer than two branches, or beside `properties`, `required`,
//!   `additionalProperties`, `items`, `enum` or `const`;
//! - `properties`/`required`/`additionalProperties` off an object, `items` off an array (or not
//!   a single schema), `enum`/`const` off a scalar;
//! - `required` naming an undeclared property, `additionalProperties` that is not a boolean;
//! - an empty `enum`, an `enum` or `const` value of another type, a `const` outside its `enum`;
//! - a root whose `type` is not `object`.
//!
//! Every violation is collected and reported in one `UNSUPPORTED_SCHEMA` error.
//!
//! # Values
//! Validation runs the `jsonschema` crate (whose semantics match the subset for every keyword
//! it keeps) and then the subset's own rule that JSON stays lossless: `-0` is not a number.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::check_lossless;

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];
const SCALARS: &[&str] = &["string", "number", "integer", "boolean", "null"];
const STRUCTURAL: &[&str] = &[
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
];

/// An output schema that passed the subset check, compiled for validation. Cheap to clone.
#[derive(Clone)]
pub struct ObjectSchema {
    schema: Arc<Value>,
    validator: Arc<jsonschema::Validator>,
}

impl std::fmt::Debug for ObjectSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ObjectSchema").field(&self.schema).finish()
    }
}

impl PartialEq for ObjectSchema {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
    }
}

impl ObjectSchema {
    /// Checks `schema` against the subset and compiles it.
    ///
    /// # Errors
    /// `UNSUPPORTED_SCHEMA`: "unsupported JSON schema: " followed by every violation.
    pub fn new(schema: Value) -> Result<Self> {
        assert_object_json_schema(&schema)?;
        let validator = jsonschema::validator_for(&schema).map_err(|error| {
            SubagentError::new(
                ErrorCode::UnsupportedSchema,
                format!("unsupported JSON schema: {error}"),
            )
        })?;
        Ok(Self {
            schema: Arc::new(schema),
            validator: Arc::new(validator),
        })
    }

    /// The schema as JSON.
    pub fn as_value(&self) -> &Value {
        &self.schema
    }

    /// Validates `value`; on failure returns every violation, one line each.
    ///
    /// # Errors
    /// The violations, as messages naming the path of each.
    pub fn validate(&self, value: &Value) -> std::result::Result<(), Vec<String>> {
        let mut violations: Vec<String> = self
            .validator
            .iter_errors(value)
            .map(|error| {
                let path = error.instance_path().to_string();
                if path.is_empty() {
                    error.to_string()
                } else {
                    format!("{path}: {error}")
                }
            })
            .collect();
        if let Err(error) = check_lossless(value) {
            violations.push(error.message().to_owned());
        }
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }
}

/// Checks that `schema` is an object-rooted schema within the subset.
///
/// # Errors
/// `UNSUPPORTED_SCHEMA` listing every violation.
pub fn assert_object_json_schema(schema: &Value) -> Result<()> {
    let mut violations = Vec::new();
    let mut stack: Vec<(String, &Value)> = vec![("schema".to_owned(), schema)];
    while let Some((path, node)) = stack.pop() {
        match node {
            Value::Object(map) => check_node(&path, map, &mut violations, &mut stack),
            _ => violations.push(format!("{path} must be an object")),
        }
    }
    if violations.is_empty() && schema.get("type").and_then(Value::as_str) != Some("object") {
        violations
            .push("schema.type must be \"object\" (structured output is object-rooted)".to_owned());
    }
    if violations.is_empty() {
        return Ok(());
    }
    Err(SubagentError::new(
        ErrorCode::UnsupportedSchema,
        format!("unsupported JSON schema: {}", violations.join("; ")),
    ))
}

fn check_node<'a>(
    path: &str,
    map: &'a Map<String, Value>,
    violations: &mut Vec<String>,
    stack: &mut Vec<(String, &'a Value)>,
) {
    for (key, value) in map {
        match key.as_str() {
            "type"
            | "oneOf"
            | "properties"
            | "required"
            | "additionalProperties"
            | "items"
            | "enum"
            | "const" => {}
            "description" | "title" => {
                if !value.is_string() {
                    violations.push(format!("{path}.{key} must be a string"));
                }
            }
            "default" | "examples" => {
                if check_lossless(value).is_err() {
                    violations.push(format!(
                        "{path}.{key}: annotation must be lossless JSON data"
                    ));
                }
            }
            other => violations.push(format!("{path}: keyword \"{other}\" is not supported")),
        }
    }
    let node_type = match map.get("type") {
        None => None,
        Some(Value::String(name)) if TYPES.contains(&name.as_str()) => Some(name.as_str()),
        Some(_) => {
            violations.push(format!("{path}.type must be one of {}", TYPES.join(", ")));
            return;
        }
    };
    if let Some(branches) = map.get("oneOf") {
        if node_type.is_some() {
            violations.push(format!("{path} must not declare both type and oneOf"));
        }
        for keyword in STRUCTURAL.iter().filter(|k| map.contains_key(**k)) {
            violations.push(format!("{path}.{keyword} is not allowed beside oneOf"));
        }
        match branches.as_array() {
            Some(branches) if branches.len() >= 2 => {
                for (index, branch) in branches.iter().enumerate() {
                    stack.push((format!("{path}.oneOf[{index}]"), branch));
                }
            }
            _ => violations.push(format!(
                "{path}.oneOf must be an array of at least two schemas"
            )),
        }
        return;
    }
    let Some(node_type) = node_type else {
        for keyword in STRUCTURAL.iter().filter(|k| map.contains_key(**k)) {
            violations.push(format!("{path}.{keyword} requires type or oneOf"));
        }
        return;
    };
    check_object_keywords(path, node_type, map, violations, stack);
    match map.get("items") {
        Some(items) if node_type == "array" => stack.push((format!("{path}.items"), items)),
        Some(_) => violations.push(format!("{path}.items is only allowed on arrays")),
        None => {}
    }
    check_literals(path, node_type, map, violations);
}

fn check_object_keywords<'a>(
    path: &str,
    node_type: &str,
    map: &'a Map<String, Value>,
    violations: &mut Vec<String>,
    stack: &mut Vec<(String, &'a Value)>,
) {
    if node_type != "object" {
        for keyword in ["properties", "required", "additionalProperties"] {
            if map.contains_key(keyword) {
                violations.push(format!("{path}.{keyword} is only allowed on objects"));
            }
        }
        return;
    }
    let declared = match map.get("properties") {
        None => None,
        Some(Value::Object(properties)) => {
            for (name, property) in properties {
                stack.push((format!("{path}.properties.{name}"), property));
            }
            Some(properties)
        }
        Some(_) => {
            violations.push(format!("{path}.properties must be an object"));
            None
        }
    };
    if let Some(required) = map.get("required") {
        match required.as_array() {
            Some(names) => {
                for name in names {
                    match name.as_str() {
                        Some(name) if declared.is_some_and(|d| d.contains_key(name)) => {}
                        Some(name) => violations.push(format!(
                            "{path}.required names undeclared property \"{name}\""
                        )),
                        None => violations.push(format!("{path}.required must list strings")),
                    }
                }
            }
            None => violations.push(format!("{path}.required must be an array of strings")),
        }
    }
    if map
        .get("additionalProperties")
        .is_some_and(|v| !v.is_boolean())
    {
        violations.push(format!("{path}.additionalProperties must be a boolean"));
    }
}

fn check_literals(
    path: &str,
    node_type: &str,
    map: &Map<String, Value>,
    violations: &mut Vec<String>,
) {
    let scalar = SCALARS.contains(&node_type);
    for keyword in ["enum", "const"] {
        if map.contains_key(keyword) && !scalar {
            violations.push(format!("{path}.{keyword} is only allowed on scalar types"));
        }
    }
    if !scalar {
        return;
    }
    if let Some(values) = map.get("enum") {
        match values.as_array() {
            Some(values) if !values.is_empty() => {
                if values.iter().any(|v| !is_of_type(v, node_type)) {
                    violations.push(format!("{path}.enum values must be of type {node_type}"));
                }
            }
            _ => violations.push(format!("{path}.enum must be a non-empty array")),
        }
    }
    if let Some(value) = map.get("const") {
        if !is_of_type(value, node_type) {
            violations.push(format!("{path}.const must be of type {node_type}"));
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            if !values.contains(value) {
                violations.push(format!("{path}.const must be a member of enum"));
            }
        }
    }
}

/// Whether `value` is of the subset type `name` (`-0` is no number: it is not lossless).
fn is_of_type(value: &Value, name: &str) -> bool {
    match (name, value) {
        ("string", Value::String(_)) | ("boolean", Value::Bool(_)) | ("null", Value::Null) => true,
        ("number", Value::Number(n)) => n
            .as_f64()
            .is_some_and(|f| f.is_finite() && !(f == 0.0 && f.is_sign_negative())),
        ("integer", Value::Number(n)) => {
            n.is_i64()
                || n.is_u64()
                || n.as_f64().is_some_and(|f| {
                    f.is_finite() && f.fract() == 0.0 && !(f == 0.0 && f.is_sign_negative())
                })
        }
        _ => false,
    }
}
