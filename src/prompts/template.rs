//! `{{name}}` templates, substituted once left to right: inserted text is never rescanned, so
//! user text holding `{{...}}` cannot pull in other variables.

use std::collections::{BTreeMap, HashSet};

/// A template problem, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template uses a variable the caller did not provide.
    #[error("missing template variable `{0}`")]
    Missing(String),
    /// A `{{` without a matching `}}`.
    #[error("unclosed `{{{{` in template")]
    Unclosed,
    /// The rendered text would pass the size it was allowed.
    #[error("the rendered prompt would exceed {limit} bytes (server.max_prompt_bytes)")]
    TooLarge {
        /// The bytes it was allowed.
        limit: usize,
    },
}

/// Renders `template` with `vars`.
pub fn render(template: &str, vars: &BTreeMap<String, String>) -> Result<String, TemplateError> {
    render_bounded(template, vars, usize::MAX)
}

/// Renders, refusing before the text passes `limit` bytes (repeated variables outgrow the inputs).
pub fn render_bounded(
    template: &str,
    vars: &BTreeMap<String, String>,
    limit: usize,
) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len().min(limit));
    let push = |out: &mut String, text: &str| {
        if out.len().saturating_add(text.len()) > limit {
            return Err(TemplateError::TooLarge { limit });
        }
        out.push_str(text);
        Ok(())
    };
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        push(&mut out, &rest[..open])?;
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(TemplateError::Unclosed)?;
        let name = after[..close].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| TemplateError::Missing(name.to_owned()))?;
        push(&mut out, value)?;
        rest = &after[close + 2..];
    }
    push(&mut out, rest)?;
    Ok(out)
}

/// Bytes of `template` outside its `{{variables}}` (an unclosed `{{` counts as text).
pub fn literal_len(template: &str) -> usize {
    let mut len = 0;
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        len += open;
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            return len + (rest.len() - open);
        };
        rest = &after[close + 2..];
    }
    len + rest.len()
}

/// Names of the variables a template uses, in order of first use.
pub fn variables(template: &str) -> Result<Vec<String>, TemplateError> {
    let mut names: Vec<String> = Vec::new();
    // A set beside the list: many distinct names must not cost a list scan per use.
    let mut seen: HashSet<&str> = HashSet::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(TemplateError::Unclosed)?;
        let name = after[..close].trim();
        if seen.insert(name) {
            names.push(name.to_owned());
        }
        rest = &after[close + 2..];
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn renders_and_names_missing_variables() {
        let t = "Hi {{ name }}, about {{topic}}.";
        assert_eq!(
            render(t, &vars(&[("name", "Ann"), ("topic", "x")])).unwrap(),
            "Hi Ann, about x."
        );
        assert_eq!(
            render(t, &vars(&[("name", "Ann")])),
            Err(TemplateError::Missing("topic".into()))
        );
        assert_eq!(variables(t).unwrap(), vec!["name", "topic"]);
        assert_eq!(literal_len("Hi {{ name }}, {{x}}!"), "Hi , !".len());
        assert_eq!(literal_len("no variables"), 12);
        assert_eq!(literal_len("open {{ never"), 13);
        assert_eq!(render("{{oops", &vars(&[])), Err(TemplateError::Unclosed));
    }

    #[test]
    fn rendering_stops_at_the_limit() {
        let v = vars(&[("x", "0123456789")]);
        assert_eq!(render_bounded("{{x}}{{x}}", &v, 20).unwrap().len(), 20);
        assert_eq!(
            render_bounded("{{x}}{{x}}!", &v, 20),
            Err(TemplateError::TooLarge { limit: 20 })
        );
    }

    #[test]
    fn inserted_text_is_not_rescanned() {
        let out = render("{{a}}", &vars(&[("a", "{{b}}"), ("b", "secret")])).unwrap();
        assert_eq!(out, "{{b}}");
    }
}
