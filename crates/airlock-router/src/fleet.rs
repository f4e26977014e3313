//! The fleet as the router sees it: the peers it was given (static addresses and DNS
//! names, re-resolved), what each node last said on `/readyz` (its name, whether it
//! drains, its free capacity), and the order new work tries them in.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

/// One entry of `--route PEERS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// `HOST:PORT`: an address, or a name resolved like a DNS peer.
    Static(String),
    /// `dns:NAME:PORT`: every A/AAAA record of NAME (a Kubernetes headless Service), on
    /// PORT, re-resolved as nodes come and go.
    Dns {
        /// The name to resolve.
        name: String,
        /// The nodes' port.
        port: u16,
    },
}

impl Peer {
    /// What to resolve: `host:port`.
    pub fn lookup(&self) -> String {
        match self {
            Peer::Static(hp) => hp.clone(),
            Peer::Dns { name, port } => format!("{name}:{port}"),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Static(hp) => f.write_str(hp),
            Peer::Dns { name, port } => write!(f, "dns:{name}:{port}"),
        }
    }
}

/// Parses `--route PEERS`: a comma list of `HOST:PORT` and `dns:NAME:PORT` (IPv6 as
/// `[ADDR]:PORT`).
pub fn parse_peers(text: &str) -> Result<Vec<Peer>, String> {
    let mut peers = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let (dns, rest) = match item.strip_prefix("dns:") {
            Some(rest) => (true, rest),
            None => (false, item),
        };
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err(format!("{item:?}: expected HOST:PORT or dns:NAME:PORT"));
        };
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{item:?}: {port:?} is not a port (1 to 65535)"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.is_empty() || bare.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(format!("{item:?}: {host:?} is not a host name or address"));
        }
        peers.push(if dns {
            Peer::Dns {
                name: host.to_owned(),
                port,
            }
        } else {
            Peer::Static(format!("{host}:{port}"))
        });
    }
    if peers.is_empty() {
        return Err("no peers: give HOST:PORT or dns:NAME:PORT, comma-separated".into());
    }
    Ok(peers)
}

/// What a node said on its last `/readyz`, and what the router did since.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Its node name (`--node`); `None` for a daemon without one (it gets no work: the
    /// ids it hands out could not be routed back).
    pub node: Option<String>,
    /// It answered its last poll (or its last forwarded connection).
    pub up: bool,
    /// `/readyz` said ready (warm and not draining).
    pub ready: bool,
    /// It drains (SIGTERM): no new work.
    pub stopping: bool,
    /// Sandboxes it could admit now.
    pub sandboxes_free: u64,
    /// Memory of its budget no sandbox holds.
    pub memory_free_bytes: u64,
    /// New work the router sent it since that poll (a burst between polls spreads).
    pub assigned: u64,
    /// When it last answered.
    pub seen: Option<Instant>,
    /// Why its last poll failed, if it did.
    pub error: Option<String>,
}

impl Status {
    /// The status a `/readyz` body (whatever its HTTP status) says.
    pub fn from_readyz(v: &serde_json::Value) -> Status {
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Status {
            node: v["node"].as_str().map(str::to_owned),
            up: true,
            ready: v["ready"].as_bool().unwrap_or(false),
            stopping: v["stopping"].as_bool().unwrap_or(false),
            sandboxes_free: n("sandboxes_free"),
            memory_free_bytes: n("memory_free_bytes"),
            assigned: 0,
            seen: Some(Instant::now()),
            error: None,
        }
    }

    /// Whether new work may go there.
    pub fn takes_work(&self) -> bool {
        self.up && !self.stopping && self.node.is_some()
    }
}

/// Every node's status, by address.
#[derive(Debug, Default)]
pub struct Fleet {
    nodes: Mutex<HashMap<SocketAddr, Status>>,
}

impl Fleet {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Status>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The addresses the peers resolve to now: new ones are added (down until polled),
    /// gone ones forgotten.
    pub fn set_addresses(&self, addrs: &[SocketAddr]) {
        let mut nodes = self.lock();
        nodes.retain(|a, _| addrs.contains(a));
        for a in addrs {
            nodes.entry(*a).or_default();
        }
    }

    /// The addresses known now.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        let mut v: Vec<_> = self.lock().keys().copied().collect();
        v.sort();
        v
    }

    /// Records a poll's outcome for `addr` (a node that stopped answering keeps its name,
    /// so its ids get an error naming it).
    pub fn record(&self, addr: SocketAddr, polled: Result<Status, String>) {
        let mut nodes = self.lock();
        let Some(entry) = nodes.get_mut(&addr) else { return };
        match polled {
            Ok(mut s) => {
                if s.node.is_none() && entry.node.is_none() {
                    tracing::warn!(%addr, "peer has no node name (airlock serve --node NAME): it gets no work");
                }
                if !entry.up || entry.node != s.node {
                    tracing::info!(%addr, node = s.node.as_deref().unwrap_or("-"), "node up");
                }
                s.assigned = 0;
                *entry = s;
            }
            Err(why) => {
                if entry.up {
                    tracing::warn!(%addr, node = entry.node.as_deref().unwrap_or("-"), error = %why, "node down");
                }
                entry.up = false;
                entry.ready = false;
                entry.error = Some(why);
            }
        }
    }

    /// Marks `addr` down at once (a connection to it failed), until its next poll.
    pub fn mark_down(&self, addr: SocketAddr, why: &str) {
        self.record(addr, Err(why.to_owned()));
    }

    /// Marks `addr` draining at once (it refused new work with `shutting_down`).
    pub fn mark_stopping(&self, addr: SocketAddr) {
        if let Some(s) = self.lock().get_mut(&addr) {
            s.stopping = true;
            s.ready = false;
        }
    }

    /// Counts one piece of new work sent to `addr`.
    pub fn assign(&self, addr: SocketAddr) {
        if let Some(s) = self.lock().get_mut(&addr) {
            s.assigned += 1;
        }
    }

    /// The address of node `name`: one that is up if any, else the last one known to
    /// have had that name; `None` when no peer ever said it.
    pub fn find(&self, name: &str) -> Option<(SocketAddr, bool)> {
        let nodes = self.lock();
        let mut found: Option<(SocketAddr, bool)> = None;
        for (a, s) in nodes.iter() {
            if s.node.as_deref() == Some(name) {
                let better = match found {
                    None => true,
                    Some((_, up)) => s.up && !up,
                };
                if better {
                    found = Some((*a, s.up));
                }
            }
        }
        found
    }

    /// Every address with its status.
    pub fn snapshot(&self) -> Vec<(SocketAddr, Status)> {
        let mut v: Vec<_> = self.lock().iter().map(|(a, s)| (*a, s.clone())).collect();
        v.sort_by_key(|(a, _)| *a);
        v
    }

    /// The nodes that may take new work, best first.
    pub fn candidates(&self) -> Vec<SocketAddr> {
        order(&self.snapshot())
    }

    /// The names of the nodes known, for messages.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().values().filter_map(|s| s.node.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

/// The nodes of `nodes` that take new work, best first: free sandboxes (less what was sent
/// since the last poll), then a warm pool, then free memory; the address breaks ties.
pub fn order(nodes: &[(SocketAddr, Status)]) -> Vec<SocketAddr> {
    let mut c: Vec<&(SocketAddr, Status)> = nodes.iter().filter(|(_, s)| s.takes_work()).collect();
    c.sort_by(|(a1, s1), (a2, s2)| {
        let free = |s: &Status| s.sandboxes_free as i64 - s.assigned as i64;
        free(s2)
            .cmp(&free(s1))
            .then(s2.ready.cmp(&s1.ready))
            .then(s2.memory_free_bytes.cmp(&s1.memory_free_bytes))
            .then(a1.cmp(a2))
    });
    c.into_iter().map(|(a, _)| *a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn node(name: &str, free: u64) -> Status {
        Status {
            node: Some(name.into()),
            up: true,
            ready: true,
            sandboxes_free: free,
            memory_free_bytes: free << 28,
            ..Default::default()
        }
    }

    #[test]
    fn peers_are_static_addresses_and_dns_names() {
        assert_eq!(
            parse_peers("127.0.0.1:8711, node-b:8080,dns:airlock-nodes.ns.svc:8080,[::1]:9").unwrap(),
            vec![
                Peer::Static("127.0.0.1:8711".into()),
                Peer::Static("node-b:8080".into()),
                Peer::Dns {
                    name: "airlock-nodes.ns.svc".into(),
                    port: 8080
                },
                Peer::Static("[::1]:9".into()),
            ]
        );
        for bad in [
            "",
            ",",
            "host",
            "host:",
            "host:0",
            "host:99999",
            "dns:x",
            ":80",
            "dns::80",
            "a b:80",
        ] {
            assert!(parse_peers(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn new_work_goes_to_the_most_free_node_that_is_up_and_not_draining() {
        let mut draining = node("n4", 50);
        draining.stopping = true;
        let mut down = node("n5", 60);
        down.up = false;
        let mut unnamed = node("x", 70);
        unnamed.node = None;
        let nodes = vec![
            (addr(1), node("n1", 3)),
            (addr(2), node("n2", 9)),
            (addr(3), node("n3", 5)),
            (addr(4), draining),
            (addr(5), down),
            (addr(6), unnamed),
        ];
        assert_eq!(order(&nodes), vec![addr(2), addr(3), addr(1)]);
    }

    #[test]
    fn what_was_sent_since_the_last_poll_counts_against_a_node() {
        let fleet = Fleet::default();
        fleet.set_addresses(&[addr(1), addr(2)]);
        fleet.record(addr(1), Ok(node("n1", 4)));
        fleet.record(addr(2), Ok(node("n2", 4)));
        let mut picks = Vec::new();
        for _ in 0..6 {
            let best = fleet.candidates()[0];
            fleet.assign(best);
            picks.push(best.port());
        }
        // A burst alternates instead of piling onto one node.
        assert_eq!(picks, vec![1, 2, 1, 2, 1, 2]);
        // A poll resets the count.
        fleet.record(addr(1), Ok(node("n1", 4)));
        assert_eq!(fleet.candidates()[0], addr(1));
    }

    #[test]
    fn a_node_that_goes_down_keeps_its_name_and_takes_no_work() {
        let fleet = Fleet::default();
        fleet.set_addresses(&[addr(1), addr(2)]);
        fleet.record(addr(1), Ok(node("n1", 4)));
        fleet.record(addr(2), Ok(node("n2", 9)));
        assert_eq!(fleet.candidates(), vec![addr(2), addr(1)]);
        fleet.mark_down(addr(2), "connection refused");
        assert_eq!(fleet.candidates(), vec![addr(1)]);
        assert_eq!(fleet.find("n2"), Some((addr(2), false)));
        assert_eq!(fleet.find("n1"), Some((addr(1), true)));
        assert_eq!(fleet.find("n9"), None);
        fleet.mark_stopping(addr(1));
        assert!(fleet.candidates().is_empty());
        // Gone from DNS: forgotten.
        fleet.set_addresses(&[addr(1)]);
        assert_eq!(fleet.find("n2"), None);
    }

    #[test]
    fn readyz_bodies_give_name_drain_and_capacity() {
        let s = Status::from_readyz(&serde_json::json!({
            "ready": false, "stopping": true, "node": "n1", "sandboxes_free": 7,
            "memory_free_bytes": 1024
        }));
        assert_eq!(s.node.as_deref(), Some("n1"));
        assert!(s.up && s.stopping && !s.ready && !s.takes_work());
        assert_eq!((s.sandboxes_free, s.memory_free_bytes), (7, 1024));
    }
}
