//! What a new prompt version must be before it is stored: able to serve a call.

use super::{
    store::{NewPrompt, PromptError},
    template,
};
use crate::config::MAX_OUTPUT_TOKENS;

const MAX_KEY_BYTES: usize = 128;

/// Why `key` can name no prompt, if it cannot: it is logged, audited and matched against
/// task names, so a bounded line of text, not blank. A version is stored, and a request
/// names one (`ExecuteRequest.prompt_key`), under the same rule.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.trim().is_empty() {
        return Err("must not be blank".into());
    }
    if key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(format!(
            "must be at most {MAX_KEY_BYTES} bytes, without control characters"
        ));
    }
    Ok(())
}

/// Refuses a version that could never serve a call, rather than fail every later call.
pub(super) fn check(new: &NewPrompt) -> Result<(), PromptError> {
    if new.key.is_empty() {
        return Err(PromptError::Invalid {
            field: "prompt_key",
            why: "is required".into(),
        });
    }
    check_key(&new.key).map_err(|why| PromptError::Invalid {
        field: "prompt_key",
        why,
    })?;
    if new.user_template.trim().is_empty() {
        return Err(PromptError::Invalid {
            field: "user_prompt_template",
            why: "is required".into(),
        });
    }
    let user_vars = template::variables(&new.user_template)?;
    let system_vars = template::variables(&new.system)?;
    if let Some(provided) = super::typed_variables(&new.key) {
        for (field, used) in [
            ("user_prompt_template", &user_vars),
            ("system_prompt", &system_vars),
        ] {
            if let Some(name) = used.iter().find(|v| !provided.contains(&v.as_str())) {
                return Err(PromptError::Invalid {
                    field,
                    why: format!(
                        "unknown template variable `{name}`; `{}` provides: {}",
                        new.key,
                        provided.join(", ")
                    ),
                });
            }
        }
    }
    if let Some(t) = new.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(PromptError::Invalid {
            field: "temperature",
            why: format!("{t} is outside [0, 2]"),
        });
    }
    // Absent means the task's cap, so an explicit 0 is a mistake (the provider answers 400);
    // past the config's bound a cap would escape it.
    if let Some(m) = new
        .max_tokens
        .filter(|m| !(1..=MAX_OUTPUT_TOKENS).contains(m))
    {
        return Err(PromptError::Invalid {
            field: "max_tokens",
            why: format!("{m} is outside [1, {MAX_OUTPUT_TOKENS}]"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_a_bounded_line_and_a_template_of_many_names_parses() {
        let new = |key: &str, user_template: String| NewPrompt {
            key: key.into(),
            user_template,
            ..NewPrompt::default()
        };
        let refused = |n: &NewPrompt| {
            matches!(
                check(n),
                Err(PromptError::Invalid {
                    field: "prompt_key",
                    ..
                })
            )
        };
        assert!(refused(&new(&"k".repeat(129), "{{x}}".into())));
        assert!(refused(&new("two\nlines", "{{x}}".into())));
        assert!(check(&new(&"k".repeat(128), "{{x}}".into())).is_ok());
        // A request naming a key (`ExecuteRequest.prompt_key`) is held to the same rule.
        let long = "k".repeat(129);
        for bad in ["  ", "tab\there", long.as_str()] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_key("meeting brief (short)").is_ok());
        let template: String = (0..50_000)
            .map(|i| format!("{{{{v{i}}}}} {{{{v{i}}}}} "))
            .collect();
        let names = template::variables(&template).unwrap();
        assert_eq!(names.len(), 50_000);
        assert_eq!(
            (names[0].as_str(), names[49_999].as_str()),
            ("v0", "v49999")
        );
        assert!(check(&new("custom", template)).is_ok());
    }

    #[test]
    fn a_version_with_an_unusable_output_cap_is_refused() {
        let new = |max_tokens| NewPrompt {
            key: "sms_classify".into(),
            user_template: "{{message}}".into(),
            max_tokens,
            ..NewPrompt::default()
        };
        for ok in [None, Some(1), Some(MAX_OUTPUT_TOKENS)] {
            assert!(check(&new(ok)).is_ok(), "{ok:?}");
        }
        for refused in [Some(0), Some(MAX_OUTPUT_TOKENS + 1), Some(u32::MAX)] {
            let err = check(&new(refused)).err();
            let field = match err {
                Some(PromptError::Invalid { field, .. }) => field,
                other => panic!("{refused:?}: {other:?}"),
            };
            assert_eq!(field, "max_tokens");
        }
    }
}
