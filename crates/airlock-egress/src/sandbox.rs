//! What a sandbox in proxy mode sees of its egress, the same on every tier: the ports on
//! its loopback, the variables in its programs' environment, and where its trust bundle
//! is. Each tier puts these in place; the proxy behind them runs on the host.

use crate::Proxy;

/// The explicit HTTP proxy's port on the sandbox's loopback (squid's; the namespace is
/// private).
pub const PROXY_PORT: u16 = 3128;

/// The port the sandbox's rules redirect every other outbound TCP connection to.
pub const TRANSPARENT_PORT: u16 = 3129;

/// The resolver's port (UDP) on the sandbox's loopback; /etc/resolv.conf names it.
pub const DNS_PORT: u16 = 53;

/// Where the sandbox's trust bundle is, when its proxy intercepts TLS for secrets: the
/// path Debian-family systems and most tools read.
pub const CA_BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables that point a program at the proxy on `port` of its loopback (the usual
/// names, upper and lower case), loopback itself excepted.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let proxied = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .map(|k| (k.to_owned(), url.clone()));
    let direct = ["NO_PROXY", "no_proxy"].map(|k| (k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    proxied.into_iter().chain(direct).collect()
}

impl Proxy {
    /// Every variable a program of this proxy's sandbox gets: the proxy's, each secret's
    /// placeholder, and, when TLS is intercepted for secrets, the usual variables naming
    /// the trust bundle (for tools that do not read [`CA_BUNDLE_PATH`] by default).
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        self.sandbox_env_at(CA_BUNDLE_PATH)
    }

    /// [`Proxy::sandbox_env`] for a sandbox whose trust bundle is at `ca_path` (a
    /// micro-VM's guest installs it after its sandbox was built).
    pub fn sandbox_env_at(&self, ca_path: &str) -> Vec<(String, String)> {
        let mut env = proxy_env(PROXY_PORT);
        env.extend(self.secret_env());
        if self.ca_pem().is_some() {
            for k in [
                "SSL_CERT_FILE",
                "REQUESTS_CA_BUNDLE",
                "CURL_CA_BUNDLE",
                "NODE_EXTRA_CA_CERTS",
            ] {
                env.push((k.to_owned(), ca_path.to_owned()));
            }
        }
        env
    }
}
