//! The bounds the MCP client (`mcp`) keeps with a server it does not
//! control: how far and how long it follows `nextCursor` when listing
//! tools, how long a connection may take, and how long it waits before
//! connecting again.
//!
//! Pure decisions only: nothing here talks to a server, so the client's
//! loop stays readable and every bound is tested without one. A bound here
//! must never depend on what the server says about itself.

use std::{future::Future, time::Duration};

/// Pages of one `tools/list` followed at most. A server that keeps answering
/// with a `nextCursor` (a bug, or hostile) would otherwise be listed forever
/// while the list grows; real servers with a few hundred tools send a
/// handful of pages.
pub(super) const MAX_LIST_PAGES: usize = 100;

/// Tools kept from one server's listing at most. Each is compiled into a
/// JSON Schema validator and held in the registry, so the count is memory
/// and start-up work; 10,000 is far beyond any server we expect.
pub(super) const MAX_LISTED_TOOLS: usize = 10_000;

/// The wait before the first reconnection after a failure.
pub(super) const INITIAL_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait between connection attempts: a server back from an
/// outage rejoins within a minute.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a session must have lived, having listed its tools, for its end
/// to reset the backoff. As long as the longest wait: a session that
/// outlived it cost the server no more than waiting would have, while one
/// that ends sooner (a child process that exits after `tools/list`, a
/// server that refuses it) must not be reconnected at once, forever.
pub(super) const HEALTHY_AFTER: Duration = MAX_BACKOFF;

/// Connecting (spawning the command or reaching the URL, and the MCP
/// handshake) is given up after this long. Above rmcp's own 10 s
/// `server/discover` probe, which a legacy server may let run out before we
/// fall back to `initialize`, and a child started with `npx` may first have
/// to fetch its package.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a session that ended was healthy: it listed its tools at least
/// once and lived at least [`HEALTHY_AFTER`].
pub(super) fn healthy(listed: bool, lived: Duration) -> bool {
    listed && lived >= HEALTHY_AFTER
}

/// The exponential backoff between connection attempts: [`INITIAL_BACKOFF`]
/// doubling to [`MAX_BACKOFF`], back to the start only after a healthy
/// session. Every end of a session goes through it (a failed connection, a
/// failed listing, a closed session), so no path reconnects at once.
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
    /// The wait before connecting again, after a session that was
    /// `healthy` (see [`healthy`]) or not.
    pub(super) fn after(&mut self, healthy: bool) -> Duration {
        if healthy {
            self.next = INITIAL_BACKOFF;
        }
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(MAX_BACKOFF);
        wait
    }
}

/// Lists every item of a paginated MCP listing through `fetch` (given the
/// cursor of the page wanted, `None` for the first; answering the page's
/// items and its `nextCursor`), within `timeout` for the whole listing,
/// [`MAX_LIST_PAGES`] pages and [`MAX_LISTED_TOOLS`] items.
///
/// Past a cap it warns, naming `server`, and keeps what it has (cut to
/// [`MAX_LISTED_TOOLS`]) rather than refusing the listing: refusing would
/// end the session and reconnect, forever, to a server whose only fault is
/// a long list, while its first tools are usable. Past `timeout` the
/// listing fails (a server that slow is not answering), and the page
/// request in flight is dropped, which cancels it.
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

/// [`list_pages`] without its timeout.
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

    /// One page of the fake: its items and the next cursor.
    type Page = std::future::Ready<Result<(Vec<usize>, Option<String>), String>>;

    /// A fake `tools/list`: pages of `per_page` items, with a next cursor
    /// while fewer than `pages` were served (`None`: forever); records the
    /// cursors it was asked for.
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
        // A page a second, always with a next cursor: within the page cap,
        // the 30 s timeout ends it.
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
