//! Schema violations as a caller reads them: each offending value's JSON
//! pointer and what the schema wanted, never the value (it may be a secret
//! or personal data, and reaches logs and error details).

use jsonschema::{Validator, error::ValidationErrorKind};
use serde_json::Value;

/// Most violations reported for one input.
const MAX_VIOLATIONS: usize = 20;

/// What the schema wanted, without the value.
fn wanted(kind: &ValidationErrorKind) -> String {
    use ValidationErrorKind as K;
    match kind {
        K::Required { property } => format!(
            "missing required property {}",
            property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned)
        ),
        K::Type { kind } => match kind {
            jsonschema::error::TypeKind::Single(t) => format!("must be of type {t}"),
            jsonschema::error::TypeKind::Multiple(ts) => format!("must be one of the types {ts:?}"),
        },
        K::MaxLength { limit } => format!("longer than {limit} characters"),
        K::MinLength { limit } => format!("shorter than {limit} characters"),
        K::MaxItems { limit } => format!("more than {limit} items"),
        K::MinItems { limit } => format!("fewer than {limit} items"),
        K::Minimum { limit } => format!("below the minimum {limit}"),
        K::Maximum { limit } => format!("above the maximum {limit}"),
        K::Enum { options } => format!("must be one of {options}"),
        K::Pattern { pattern } => format!("does not match the pattern {pattern}"),
        K::Format { format } => format!("not a valid {format}"),
        other => format!("fails the schema's `{}` rule", other.keyword()),
    }
}

/// Every violation of `value`: `(JSON pointer, description)`, the pointer
/// RFC 6901's (`""` for the whole input). A missing required property gets
/// the pointer it should be at, and each property the schema does not allow
/// its own, so the caller sees which field to add or drop.
pub fn violations(validator: &Validator, value: &Value) -> Vec<(String, String)> {
    validator
        .iter_errors(value)
        .flat_map(|e| {
            let at = e.instance_path().to_string();
            match e.kind() {
                ValidationErrorKind::Required { property } => {
                    vec![(below(&at, property), wanted(e.kind()))]
                }
                ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
                    .iter()
                    .map(|name| (below(&at, &Value::String(name.clone())), NOT_ALLOWED.into()))
                    .collect(),
                kind => vec![(at, wanted(kind))],
            }
        })
        .take(MAX_VIOLATIONS)
        .collect()
}

/// What an unexpected property is told.
const NOT_ALLOWED: &str = "property not allowed by the schema";

/// The pointer of property `name` of the object at pointer `at`.
fn below(at: &str, name: &Value) -> String {
    let name = name
        .as_str()
        .map_or_else(|| name.to_string(), str::to_owned);
    format!("{at}/{}", name.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn violations_name_pointers_and_rules_never_values() {
        let schema = json!({"type": "object", "required": ["lead_id", "note", "a/b~c"],
            "additionalProperties": false,
            "properties": {"lead_id": {"type": "string"}, "a/b~c": {},
                           "note": {"type": "string", "maxLength": 5},
                           "tags": {"type": "array", "items": {"type": "string"}}}});
        let v = jsonschema::draft202012::new(&schema).unwrap();
        let found = violations(
            &v,
            &json!({"note": "CANARY-SECRET-VALUE", "tags": ["ok", 7], "extra": 1}),
        );
        let pointers: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        // Missing properties where they belong, and an extra one where it is.
        assert!(pointers.contains(&"/lead_id"), "{found:?}");
        assert!(pointers.contains(&"/a~1b~0c"), "{found:?}");
        assert!(pointers.contains(&"/extra"), "{found:?}");
        assert!(!pointers.contains(&""), "{found:?}");
        assert!(pointers.contains(&"/note"), "{found:?}");
        assert!(pointers.contains(&"/tags/1"), "{found:?}");
        let text = format!("{found:?}");
        assert!(!text.contains("CANARY"), "{text}");
        assert!(text.contains("missing required property lead_id"), "{text}");
        assert!(text.contains("longer than 5 characters"), "{text}");
        assert!(text.contains(NOT_ALLOWED), "{text}");
    }
}
