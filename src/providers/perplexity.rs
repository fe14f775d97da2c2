//! What Perplexity adds to the Chat Completions format (`openai.rs` does the
//! rest): the sources of an answer. A response, and every chunk of a stream,
//! may carry `citations` (URLs, in the order the answer's `[1]`, `[2]`
//! markers refer to) and `search_results` (`{title, url, date}`). Both become
//! [`Citation`]s, citations order first, one per URL.
//!
//! Sources are extras: an entry of an unexpected shape is skipped, never an
//! error, so a good answer is not thrown away over its bibliography.

use super::Citation;
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// The sources of a Perplexity answer: every `citations` URL in order (with
/// the title of the search result for that URL, when there is one), then the
/// search results not already cited. Deduplicated by URL.
pub(super) fn citations(
    citations: Option<&Value>,
    search_results: Option<&Value>,
) -> Vec<Citation> {
    let results: Vec<Citation> = search_results
        .and_then(Value::as_array)
        .map(|all| all.iter().filter_map(search_result).collect())
        .unwrap_or_default();
    // Lookups by URL go through sets and maps, not scans: a 4 MiB answer can
    // list hundreds of thousands of short URLs, and scanning the list for
    // each would stall a runtime worker for minutes. The first search result
    // for a URL gives its title, as a scan from the front would.
    let mut titles: HashMap<&str, Option<&str>> = HashMap::with_capacity(results.len());
    for r in &results {
        titles.entry(r.url.as_str()).or_insert(r.title.as_deref());
    }
    let cited = citations
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str);
    let uncited = results.iter().map(|r| r.url.as_str());
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out: Vec<Citation> = Vec::new();
    for url in cited.chain(uncited) {
        // First-seen order; `insert` is false for a URL already kept.
        if !url.is_empty() && seen.insert(url) {
            out.push(Citation {
                url: url.to_owned(),
                title: titles.get(url).copied().flatten().map(str::to_owned),
            });
        }
    }
    out
}

fn search_result(v: &Value) -> Option<Citation> {
    let url = v.get("url")?.as_str()?;
    let title = v
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    Some(Citation {
        url: url.to_owned(),
        title,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn c(url: &str, title: Option<&str>) -> Citation {
        Citation {
            url: url.into(),
            title: title.map(Into::into),
        }
    }

    #[test]
    fn citations_first_then_uncited_results_once_each() {
        let cites = json!([
            "https://a.example/",
            "https://b.example/",
            "https://a.example/"
        ]);
        let results = json!([
            {"title": "B page", "url": "https://b.example/", "date": "2024-05-01"},
            {"title": "C page", "url": "https://c.example/", "date": null},
            {"title": "", "url": "https://d.example/"},
            {"title": "no url"},
            "not an object"
        ]);
        assert_eq!(
            citations(Some(&cites), Some(&results)),
            vec![
                c("https://a.example/", None),
                c("https://b.example/", Some("B page")),
                c("https://c.example/", Some("C page")),
                c("https://d.example/", None),
            ]
        );
    }

    #[test]
    fn missing_or_odd_shapes_give_no_sources() {
        assert!(citations(None, None).is_empty());
        assert!(citations(Some(&json!("x")), Some(&json!({"url": "y"}))).is_empty());
        assert_eq!(
            citations(Some(&json!([1, "https://e.example/"])), None),
            vec![c("https://e.example/", None)]
        );
    }

    #[test]
    fn many_sources_keep_first_seen_order_once_each() {
        // Enough URLs that a pairwise scan would be slow; each cited twice.
        let url = |i: usize| format!("https://s{i}.example/");
        let cites: Vec<String> = (0..50_000).map(|i| url(i % 25_000)).collect();
        // Half already cited (their titles go to the citation), half new.
        let results: Vec<Value> = (12_500..37_500)
            .map(|i| json!({"title": format!("t{i}"), "url": url(i)}))
            .collect();
        let out = citations(Some(&json!(cites)), Some(&Value::Array(results)));
        assert_eq!(out.len(), 37_500);
        for (i, got) in out.iter().enumerate() {
            let title = (i >= 12_500).then(|| format!("t{i}"));
            assert_eq!(got, &c(&url(i), title.as_deref()), "source {i}");
        }
    }
}
