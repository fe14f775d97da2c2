//! A provider's HTTP clients: how many, built how, and when one is replaced.

use crate::{
    config::ProviderConfig,
    providers::{ConnectFailure, ProviderError},
};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// One provider's HTTP clients, each with its own pool, filled in order: a call takes the first
/// carrying fewer than `streams_per_connection` calls. hyper never opens a second HTTP/2
/// connection to a host at its stream limit (hyperium/hyper#2197, ADR 0010): calls would queue
/// unseen inside it. After a connection-level failure the slot gets a fresh client with an empty
/// pool, as the old pool may hold more dead connections; calls on the old one finish there.
pub struct Clients {
    config: ProviderConfig,
    per_client: usize,
    slots: Box<[Arc<Slot>]>,
}

#[derive(Default)]
struct Slot {
    client: Mutex<Built>,
    in_flight: AtomicUsize,
}

/// A slot's client (`None` until built, or once replaced) and how often it was replaced.
#[derive(Default)]
struct Built {
    client: Option<reqwest::Client>,
    generation: u64,
}

/// One call's client and its place on it, released when dropped: hold it until the body is read.
pub struct Lease {
    client: reqwest::Client,
    slot: Arc<Slot>,
    generation: u64,
}

impl Lease {
    /// The client to send the call with.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Hands back `result`, first retiring this call's client if its connection broke.
    pub fn checked<T>(&self, result: Result<T, ProviderError>) -> Result<T, ProviderError> {
        if let Err(e) = &result
            && e.connection_failure()
                .is_some_and(ConnectFailure::broke_connection)
        {
            let mut built = lock(&self.slot.client);
            if built.generation == self.generation {
                built.client = None;
                built.generation += 1;
            }
        }
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A slot's lock holds only a client handle: still usable after a panic.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Clients {
    /// The clients of one provider; the first is built now, so an unusable config fails at start.
    pub fn new(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let per_client = config.streams_per_connection.max(1);
        let count = config.concurrency().div_ceil(per_client).max(1);
        let slots: Box<[Arc<Slot>]> = (0..count).map(|_| Arc::default()).collect();
        if let Some(first) = slots.first() {
            lock(&first.client).client = Some(client(config, per_client)?);
        }
        Ok(Self {
            config: config.clone(),
            per_client,
            slots,
        })
    }

    /// A client for one call: the first with room, else the least loaded.
    pub fn lease(&self) -> Lease {
        let take = |in_flight: &AtomicUsize| {
            in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < self.per_client).then_some(n + 1)
                })
                .is_ok()
        };
        let slot = match self.slots.iter().find(|slot| take(&slot.in_flight)) {
            Some(slot) => slot,
            None => {
                let least = self
                    .slots
                    .iter()
                    .min_by_key(|slot| slot.in_flight.load(Ordering::Acquire));
                let Some(slot) = least.or(self.slots.first()) else {
                    unreachable!("a provider has at least one client slot")
                };
                slot.in_flight.fetch_add(1, Ordering::AcqRel);
                slot
            }
        };
        self.lease_of(slot)
    }

    /// Builds a missing client from the config the first was built from, so it cannot fail
    /// differently; should it fail, another slot's client serves the call.
    fn lease_of(&self, slot: &Arc<Slot>) -> Lease {
        let mut built = lock(&slot.client);
        let generation = built.generation;
        let client = match &built.client {
            Some(client) => client.clone(),
            None => match client(&self.config, self.per_client) {
                Ok(client) => built.client.insert(client).clone(),
                Err(_) => {
                    drop(built);
                    self.any_client()
                }
            },
        };
        Lease {
            client,
            slot: Arc::clone(slot),
            generation,
        }
    }

    fn any_client(&self) -> reqwest::Client {
        self.slots
            .iter()
            .find_map(|s| lock(&s.client).client.clone())
            .unwrap_or_default()
    }

    #[cfg(test)]
    fn built(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| lock(&s.client).client.is_some())
            .count()
    }
}

/// Builds one HTTP client of a provider, keeping up to `idle` connections.
fn client(config: &ProviderConfig, idle: usize) -> Result<reqwest::Client, ProviderError> {
    let builder = reqwest::Client::builder();
    let tls = config
        .base_url
        .as_deref()
        .is_none_or(|url| url.starts_with("https://"));
    let builder = match (config.http2(), tls) {
        (false, _) => builder.http1_only(),
        // ALPN offers h2 (and http/1.1 for a server without it).
        (true, true) => builder,
        (true, false) => builder.http2_prior_knowledge(),
    };
    let builder = match &config.tls_ca {
        Some(path) => {
            let unusable =
                |e: String| ProviderError::Unsupported(format!("tls_ca {}: {e}", path.display()));
            let pem = std::fs::read(path).map_err(|e| unusable(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| unusable(e.to_string()))?;
            builder.tls_certs_merge(certs)
        }
        None => builder,
    };
    builder
        // A redirect is an answer, not an instruction: followed, it would take the API key to
        // another host (reqwest strips only `Authorization`, not `x-api-key`/`x-goog-api-key`).
        .redirect(reqwest::redirect::Policy::none())
        // The router resends calls that never reached the provider, and counts them; reqwest
        // would resend protocol NACKs on its own, unseen.
        .retry(reqwest::retry::never())
        .connect_timeout(config.connect_timeout)
        // Nagle off: small request frames must not wait for ACKs.
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(idle.min(config.concurrency()).max(1))
        .user_agent(concat!("ai-orchestrator/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ProviderError::Unsupported(format!("cannot build HTTP client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients(max_concurrency: usize, streams_per_connection: usize) -> Clients {
        let toml = format!(
            "[providers.p]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             max_concurrency = {max_concurrency}\nstreams_per_connection = {streams_per_connection}\n"
        );
        let config = crate::config::Config::from_toml_str(&toml, |_| None).unwrap();
        Clients::new(&config.providers["p"]).unwrap()
    }

    fn loads(c: &Clients) -> Vec<usize> {
        c.slots
            .iter()
            .map(|s| s.in_flight.load(Ordering::SeqCst))
            .collect()
    }

    #[test]
    fn leases_fill_one_client_before_the_next() {
        let c = clients(5, 2);
        assert_eq!((loads(&c), c.built()), (vec![0, 0, 0], 1));
        let mut held: Vec<Lease> = (0..5).map(|_| c.lease()).collect();
        assert_eq!((loads(&c), c.built()), (vec![2, 2, 1], 3));
        held.push(c.lease());
        assert_eq!(loads(&c), vec![2, 2, 2]);
        held.push(c.lease());
        assert_eq!(loads(&c), vec![3, 2, 2]);
        held.swap_remove(0);
        held.swap_remove(0);
        assert_eq!(loads(&c), vec![1, 2, 2]);
        held.push(c.lease());
        assert_eq!(loads(&c), vec![2, 2, 2]);
        drop(held);
        assert_eq!((loads(&c), c.built()), (vec![0, 0, 0], 3));
    }

    #[test]
    fn one_client_under_ordinary_load() {
        let c = clients(64, 100);
        let held: Vec<Lease> = (0..64).map(|_| c.lease()).collect();
        assert_eq!((loads(&c), c.built()), (vec![64], 1));
        drop(held);
    }
}
