//! Name resolution, done by the proxy itself so that it judges and then connects to the
//! very addresses it resolved (no second lookup that DNS rebinding could switch).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Mutex;

/// A boxed future that can cross threads: what [`Resolver::resolve`] returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Turns a DNS name into addresses. The proxy never passes an IP literal.
pub trait Resolver: Send + Sync + 'static {
    /// Every address `host` has (`port` is passed through for resolvers that want it).
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// The host's resolver (`getaddrinfo` through `tokio::net::lookup_host`), run in the
/// caller's network namespace, so with the host's `/etc/hosts` and DNS servers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, port)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// A resolver answering from a fixed table, recording every name it was asked: for tests
/// and for embedding airlock where names must map to fixed addresses.
#[derive(Debug, Default)]
pub struct StaticResolver {
    /// Lower-case names, without a trailing dot.
    table: HashMap<String, Vec<IpAddr>>,
    /// Every name asked for, in order.
    queries: Mutex<Vec<String>>,
}

impl StaticResolver {
    /// An empty table: every name is "not found".
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Adds (or replaces) the answer for `name`.
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> StaticResolver {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        self.table.insert(name, addrs.to_vec());
        self
    }

    /// The names asked for so far.
    pub fn queries(&self) -> Vec<String> {
        self.queries.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        self.queries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(host.to_string());
        let key = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let answer = self
            .table
            .get(&key)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such host {host}")));
        Box::pin(std::future::ready(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_resolver_answers_from_its_table_and_records_queries() {
        let r = StaticResolver::new().with("Web.Test.", &["127.0.0.1".parse().unwrap()]);
        assert_eq!(
            r.resolve("web.test", 80).await.unwrap(),
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(r.resolve("WEB.test.", 80).await.unwrap().len(), 1);
        assert_eq!(
            r.resolve("other.test", 80).await.unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(r.queries(), ["web.test", "WEB.test.", "other.test"]);
    }

    #[tokio::test]
    async fn system_resolver_resolves_localhost_without_the_network() {
        let addrs = SystemResolver.resolve("localhost", 80).await.unwrap();
        assert!(addrs.iter().all(|a| a.is_loopback()), "{addrs:?}");
    }
}
