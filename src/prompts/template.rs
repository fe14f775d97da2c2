//! `{{name}}` templates. Variables are substituted once, left to right: text
//! inserted from a variable is never scanned again, so user text containing
//! `{{...}}` cannot pull in other variables.

use std::collections::BTreeMap;

/// A template problem, naming the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template uses a variable the caller did not provide.
    #[error("missing template variable `{0}`")]
    Missing(String),
    /// A `{{` without a matching `}}`.
    #[error("unclosed `{{{{` in template")]
    Unclosed,
}

/// Renders `template` with `vars`.
pub fn render(template: &str, vars: &BTreeMap<String, String>) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(TemplateError::Unclosed)?;
        let name = after[..close].trim();
        let value = vars
            .get(name)
            .ok_or_else(|| TemplateError::Missing(name.to_owned()))?;
        out.push_str(value);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Names of the variables a template uses, in order of first use.
pub fn variables(template: &str) -> Result<Vec<String>, TemplateError> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(TemplateError::Unclosed)?;
        let name = after[..close].trim().to_owned();
        if !names.contains(&name) {
            names.push(name);
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
        assert_eq!(render("{{oops", &vars(&[])), Err(TemplateError::Unclosed));
    }

    #[test]
    fn inserted_text_is_not_rescanned() {
        let out = render("{{a}}", &vars(&[("a", "{{b}}"), ("b", "secret")])).unwrap();
        assert_eq!(out, "{{b}}");
    }
}
