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
//! - a root whose `type` is not `object`;
//! - a schema nested deeper than [`MAX_SCHEMA_DEPTH`] levels (the check itself is iterative, but
//!   no validator should be handed an unbounded recursion).
//!
//! Every violation is collected and reported in one `UNSUPPORTED_SCHEMA` error. Literals compare
//! as JSON values: numbers by value, so `const: 1.0` is a member of `enum: [1, 2]`.
//!
//! # Values
//! Validation runs the `jsonschema` crate (whose semantics match the subset for every keyword
//! it keeps) and then the subset's own rule that JSON stays lossless: `-0` is not a number. The
//! validator is compiled from the schema without its annotations and with `required` names
//! deduplicated: annotations constrain no value, and the subset accepts what the draft's own
//! meta-schema would refuse there (an `examples` that is not an array, a repeated name).

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::session::check_lossless;

/// How deeply schema nodes may nest (the root is level 1).
pub const MAX_SCHEMA_DEPTH: usize = 64;

const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples"];

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
        if let Err(error) = assert_object_json_schema(&schema) {
            // A refused schema may be nested arbitrarily deep: take it apart without recursion.
            drop_iteratively(schema);
            return Err(error);
        }
        let validator = jsonschema::validator_for(&for_validation(&schema)).map_err(|error| {
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
    let mut stack: Vec<Pending<'_>> = vec![Pending {
        path: "schema".to_owned(),
        node: schema,
        depth: 1,
    }];
    while let Some(Pending { path, node, depth }) = stack.pop() {
        if depth > MAX_SCHEMA_DEPTH {
            violations.push(format!(
                "{path}: schemas may nest at most {MAX_SCHEMA_DEPTH} levels deep"
            ));
            continue;
        }
        match node {
            Value::Object(map) => {
                let mut children = Vec::new();
                check_node(&path, map, &mut violations, &mut children);
                stack.extend(children.into_iter().map(|(path, node)| Pending {
                    path,
                    node,
                    depth: depth + 1,
                }));
            }
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

/// Drops `value` without recursing, however deeply it nests (serde_json's own drop recurses
/// once per level).
fn drop_iteratively(value: Value) {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.into_iter().map(|(_, child)| child)),
            _ => {}
        }
    }
}

/// A schema node still to check.
struct Pending<'a> {
    path: String,
    node: &'a Value,
    depth: usize,
}

/// The schema the validator compiles: annotations dropped, `required` names deduplicated (see
/// the module docs). Only called on a schema that passed the subset check, so its depth is
/// bounded.
fn for_validation(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !ANNOTATIONS.contains(&key.as_str()))
                .map(|(key, value)| {
                    let value = match key.as_str() {
                        "properties" => match value {
                            Value::Object(properties) => Value::Object(
                                properties
                                    .iter()
                                    .map(|(name, property)| {
                                        (name.clone(), for_validation(property))
                                    })
                                    .collect(),
                            ),
                            other => other.clone(),
                        },
                        "items" => for_validation(value),
                        "oneOf" => match value {
                            Value::Array(branches) => {
                                Value::Array(branches.iter().map(for_validation).collect())
                            }
                            other => other.clone(),
                        },
                        "required" => match value {
                            Value::Array(names) => {
                                let mut unique: Vec<Value> = Vec::with_capacity(names.len());
                                for name in names {
                                    if !unique.contains(name) {
                                        unique.push(name.clone());
                                    }
                                }
                                Value::Array(unique)
                            }
                            other => other.clone(),
                        },
                        _ => value.clone(),
                    };
                    (key.clone(), value)
                })
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
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
            if !values.iter().any(|member| same_literal(member, value)) {
                violations.push(format!("{path}.const must be a member of enum"));
            }
        }
    }
}

/// Whether two literals are the same JSON value: numbers compare by value (`1.0` is `1`).
fn same_literal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => {
            match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
                (Some(a), Some(b), _, _) => a == b,
                (_, _, Some(a), Some(b)) => a == b,
                _ => a.as_f64().zip(b.as_f64()).is_some_and(|(a, b)| a == b),
            }
        }
        _ => left == right,
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
