//! The bounds the MCP client keeps with a server it does not control:
//! pages and time of a `tools/list`, connection time, reconnect backoff.
//! Pure decisions, tested without a server; no bound may depend on what the
//! server says about itself.

use std::{future::Future, time::Duration};

/// Pages of one `tools/list` followed at most: a server that never stops
/// sending `nextCursor` (a bug, or hostile) would be listed forever.
pub(super) const MAX_LIST_PAGES: usize = 100;

/// Tools kept from one server's listing at most: each is a compiled schema
/// held in memory; 10,000 is far beyond any server we expect.
pub(super) const MAX_LISTED_TOOLS: usize = 10_000;

/// The wait before the first reconnection after a failure.
pub(super) const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between attempts: a server back from an outage rejoins within a minute.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a listed session must live for its end to reset the backoff: the
/// longest wait, so it cost the server no more than waiting; one that ends
/// sooner (a child exiting after `tools/list`) is never reconnected at once.
pub(super) const HEALTHY_AFTER: Duration = MAX_BACKOFF;

/// Connecting (spawn or URL, and the handshake) is given up after this:
/// above rmcp's own 10 s `server/discover` probe, which a legacy server may
/// run out before `initialize`, with room for `npx` to fetch its package.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a session that ended was healthy: listed, and lived [`HEALTHY_AFTER`].
pub(super) fn healthy(listed: bool, lived: Duration) -> bool {
    listed && lived >= HEALTHY_AFTER
}

/// Exponential backoff between connection attempts, reset only by a healthy
/// session; every end of a session goes through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: INITIAL_BACKOFF,
        }
    }
}

impl Backoff {
    /// The wait before connecting again, after a session `healthy` or not.
    pub(super) fn after(&mut self, healthy: bool) -> Duration {
        if healthy {
            self.next = INITIAL_BACKOFF;
        }
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(MAX_BACKOFF);
        wait
    }
}

/// Lists a paginated MCP listing through `fetch` within `timeout`,
/// [`MAX_LIST_PAGES`] and [`MAX_LISTED_TOOLS`]. Past a cap it warns and keeps
/// what it has: refusing would reconnect forever over a long list. Past
/// `timeout` it fails, dropping (cancelling) the page in flight.
pub(super) async fn list_pages<T, F, Fut>(
    server: &str,
    timeout: Duration,
    fetch: F,
) -> Result<Vec<T>, String>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), String>>,
{
    tokio::time::timeout(timeout, follow_pages(server, fetch))
        .await
        .map_err(|_| format!("tools/list did not finish within {timeout:?}"))?
}

async fn follow_pages<T, F, Fut>(server: &str, mut fetch: F) -> Result<Vec<T>, String>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), String>>,
{
    let mut items = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let (page, next) = fetch(cursor.take()).await?;
        items.extend(page);
        let more = next.is_some();
        if items.len() > MAX_LISTED_TOOLS || (more && items.len() == MAX_LISTED_TOOLS) {
            items.truncate(MAX_LISTED_TOOLS);
            tracing::warn!(
                server,
                kept = MAX_LISTED_TOOLS,
                "MCP server lists more tools than we keep; the rest are ignored"
            );
            return Ok(items);
        }
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(items),
        }
    }
    tracing::warn!(
        server,
        pages = MAX_LIST_PAGES,
        kept = items.len(),
        "MCP server's tool list did not end within the page limit; keeping the pages listed"
    );
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A listing timeout the fakes never reach.
    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn backoff_doubles_to_its_cap_whatever_ended_the_session() {
        let mut backoff = Backoff::default();
        let waits: Vec<u64> = (0..9).map(|_| backoff.after(false).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn only_a_healthy_session_resets_the_backoff() {
        let mut backoff = Backoff::default();
        for _ in 0..5 {
            backoff.after(false);
        }
        assert_eq!(backoff.after(true), INITIAL_BACKOFF);
        assert_eq!(backoff.after(false), INITIAL_BACKOFF * 2);
    }

    #[test]
    fn a_session_is_healthy_only_if_it_listed_and_lived() {
        assert!(healthy(true, HEALTHY_AFTER));
        assert!(!healthy(true, HEALTHY_AFTER - Duration::from_millis(1)));
        // Up for hours but never listed (tools/list refused): not healthy.
        assert!(!healthy(false, Duration::from_secs(3600)));
    }

    type Page = std::future::Ready<Result<(Vec<usize>, Option<String>), String>>;

    /// A fake `tools/list`: `per_page` items, a cursor until `pages` (`None`: forever).
    fn pages(
        per_page: usize,
        pages: Option<usize>,
        asked: Arc<Mutex<Vec<Option<String>>>>,
    ) -> impl FnMut(Option<String>) -> Page {
        let mut served = 0;
        move |cursor| {
            asked.lock().unwrap().push(cursor);
            let items: Vec<usize> = (served * per_page..(served + 1) * per_page).collect();
            served += 1;
            let next = match pages {
                Some(n) if served >= n => None,
                _ => Some(format!("c{served}")),
            };
            std::future::ready(Ok((items, next)))
        }
    }

    #[tokio::test]
    async fn follows_the_cursor_to_the_last_page() {
        let asked = Arc::default();
        let items = list_pages("s", LONG, pages(2, Some(3), Arc::clone(&asked)))
            .await
            .unwrap();
        assert_eq!(items, [0, 1, 2, 3, 4, 5]);
        assert_eq!(
            *asked.lock().unwrap(),
            [None, Some("c1".to_owned()), Some("c2".to_owned())]
        );
    }

    #[tokio::test]
    async fn a_cursor_that_never_ends_stops_at_the_page_cap() {
        let asked = Arc::default();
        let items = list_pages("s", LONG, pages(1, None, Arc::clone(&asked)))
            .await
            .unwrap();
        assert_eq!(asked.lock().unwrap().len(), MAX_LIST_PAGES);
        assert_eq!(items.len(), MAX_LIST_PAGES, "the pages listed are kept");
    }

    #[tokio::test]
    async fn a_list_past_the_tool_cap_is_cut_to_it() {
        let asked = Arc::default();
        let items = list_pages("s", LONG, pages(3_000, None, Arc::clone(&asked)))
            .await
            .unwrap();
        assert_eq!(items.len(), MAX_LISTED_TOOLS);
        assert_eq!(items.last(), Some(&(MAX_LISTED_TOOLS - 1)));
        assert_eq!(asked.lock().unwrap().len(), 4, "no page asked past the cap");

        // Exactly the cap with more announced: no further page is asked.
        let asked = Arc::default();
        let items = list_pages("s", LONG, pages(5_000, None, Arc::clone(&asked)))
            .await
            .unwrap();
        assert_eq!(items.len(), MAX_LISTED_TOOLS);
        assert_eq!(asked.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_failed_page_fails_the_listing() {
        let mut served = 0;
        let result: Result<Vec<u8>, String> = list_pages("s", LONG, |_| {
            served += 1;
            std::future::ready(if served < 2 {
                Ok((vec![1], Some("next".to_owned())))
            } else {
                Err("-32601 tools/list".to_owned())
            })
        })
        .await;
        assert_eq!(result, Err("-32601 tools/list".to_owned()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_too_slow_fails_at_its_timeout() {
        let started = tokio::time::Instant::now();
        let mut served = 0;
        // A page a second, always with a next cursor: the 30 s timeout ends it.
        let result: Result<Vec<u8>, String> = list_pages("s", Duration::from_secs(30), |_| {
            served += 1;
            let next = Some(format!("c{served}"));
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, String>((vec![0u8], next))
            }
        })
        .await;
        assert!(result.unwrap_err().contains("within 30s"));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(30) && took < Duration::from_secs(31),
            "{took:?}"
        );
    }
}
