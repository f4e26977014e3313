//! The filtering egress proxy of an airlock sandbox: the only way a sandboxed program
//! reaches the network in proxy mode.
//!
//! The program sees an HTTP proxy (`HTTP_PROXY`/`HTTPS_PROXY`). It speaks HTTP/1.1
//! `CONNECT host:port` (a raw tunnel: HTTPS or any TCP) and absolute-form plain-HTTP
//! requests (`GET http://host/path`, forwarded with one request per connection). For
//! every connection or request the proxy:
//!
//! 1. parses the head strictly (a `Host` header that disagrees with the target, userinfo,
//!    both `Content-Length` and `Transfer-Encoding`, … are a `400`);
//! 2. judges the host by the [`Policy`]: allow patterns (`pypi.org`, `*.pythonhosted.org`,
//!    `api.example.com:8443`; without a port only 80 and 443), cloud metadata names
//!    always denied, IP literals in every spelling (`2852039166`, `0xa9fea9fe`,
//!    `[::ffff:a9fe:a9fe]`) judged by the address they mean;
//! 3. resolves a name itself ([`Resolver`]) and denies the request if *any* address is
//!    loopback, private, link-local (the metadata services), CGNAT, ULA, multicast,
//!    reserved, … or an IPv6 form embedding such an IPv4 address, unless an
//!    `allow_cidrs` range allows it on purpose;
//! 4. connects to the very address it checked (no second lookup: DNS rebinding cannot
//!    switch it), within the [`ProxyLimits`] (connections, bytes, connect and idle
//!    timeouts);
//! 5. logs an [`airlock_spec::EgressEntry`]: host, port, address, decision, a reason a
//!    person can act on, bytes both ways and duration.
//!
//! Denials reach the program as a `403` whose body is the reason; redirects are relayed,
//! never followed, so each follow-up request is judged anew.
//!
//! # Quickstart
//!
//! ```
//! use std::sync::Arc;
//! use airlock_egress::{Policy, Proxy, ProxyLimits, SystemResolver, Target};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::new(
//!     &["pypi.org".into(), "*.pythonhosted.org".into()],
//!     &["10.1.2.3/32".into()], // an internal service, allowed on purpose
//! )?;
//! assert_eq!(policy.check_name("Files.PythonHosted.org", 443), Ok(Target::Name("files.pythonhosted.org".into())));
//! assert_eq!(policy.check_name("pypi.org.evil.com", 443), Err("not in allowlist".into()));
//! assert_eq!(policy.check_name("0xa9fea9fe", 80), Err("link-local address 169.254.169.254".into()));
//! assert_eq!(policy.check_addr("10.0.0.5".parse()?), Err("private address 10.0.0.5".into()));
//! assert_eq!(policy.check_addr("10.1.2.3".parse()?), Ok(()));
//!
//! // Serve a listener (in airlock: bound inside the sandbox's network namespace).
//! let proxy = Proxy::new(policy, ProxyLimits::default(), Arc::new(SystemResolver));
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let port = listener.local_addr()?.port();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(Arc::clone(&proxy).serve(listener, async {
//!     let _ = stopped.await;
//! }));
//!
//! // The program would now run with HTTP_PROXY=http://127.0.0.1:{port}.
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! let mut client = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
//! client.write_all(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n").await?;
//! let mut answer = String::new();
//! client.read_to_string(&mut answer).await?;
//! assert!(answer.starts_with("HTTP/1.1 403 Forbidden"));
//! assert!(answer.ends_with("link-local address 169.254.169.254\n"));
//!
//! stop.send(()).ok();
//! server.await?; // every connection has ended and is logged
//! let log = proxy.log();
//! assert_eq!((log[0].host.as_str(), log[0].allowed), ("169.254.169.254", false));
//! assert_eq!(proxy.counts(), (0, 1));
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod addr;
mod control;
mod dns;
mod mitm;
mod policy;
mod proxy;
mod redirect;
mod relay;
mod request;
mod resolver;
mod sandbox;
mod secrets;
mod service;

#[cfg(test)]
mod test_util;

pub use addr::{Cidr, CidrError, format_ip, format_ipv6, parse_ipv4_literal};
pub use control::{Control, Decision, Pending};
pub use mitm::{MitmError, TrustRoots};
pub use policy::{DEFAULT_PORTS, MAX_ENTRIES, Policy, PolicyError, Target, parse_host};
pub use proxy::{ClientStream, Proxy, ProxyLimits};
pub use redirect::original_destination;
pub use resolver::{BoxFuture, Resolver, StaticResolver, SystemResolver};
pub use sandbox::{CA_BUNDLE_PATH, DNS_PORT, PROXY_PORT, TRANSPARENT_PORT, proxy_env};
pub use service::{Served, Stop};

/// Why a sandbox's proxy could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The policy is wrong (names the field).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The interception of secrets cannot be prepared on this host (no trust roots).
    #[error(transparent)]
    Mitm(#[from] MitmError),
}
pub use secrets::{MAX_SECRETS, MAX_VALUE_BYTES, PLACEHOLDER_PREFIX, SecretConfig, Secrets};
