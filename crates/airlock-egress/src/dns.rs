//! The sandbox's resolver: the only DNS a sandbox in proxy mode has (its /etc/resolv.conf
//! names it, and its network namespace redirects every UDP query to port 53 to it).
//!
//! It answers a name only when the policy allows it (any allow pattern's host, no deny
//! rule), with the addresses the host's resolver gives, only when all of them pass the
//! SSRF guard; every other name gets NXDOMAIN. Nothing the program wrote goes onto a
//! network: a denied name is never looked up, and an allowed one is looked up by name
//! through the host's resolver, not forwarded as the program's packet, so a DNS tunnel
//! (many unique subdomains of an unlisted domain) reaches nothing. Only IPv4 addresses
//! are answered (the sandbox has no IPv6 route). Every query is logged.
//!
//! With `"on_denied": "ask"`, an unlisted name is answered with a stand-in address from
//! 198.18.0.0/15 (a range no sandbox may reach) and no lookup: the program's connection
//! to it is redirected to the proxy, which knows the name by the stand-in, holds it for
//! approval, and resolves the name only once it is approved.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use airlock_spec::{EgressEntry, EgressKind};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType, rdata::A};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use crate::addr::format_ip;
use crate::policy::Policy;
use crate::proxy::Proxy;

/// Answers' time to live: short, so a policy change is seen soon by caching programs.
const TTL: u32 = 30;

/// Names remembered by address, at most this many (the oldest are forgotten).
const MAX_NAMES: usize = 4096;

/// Queries answered at once; more are dropped (the program's resolver retries).
const MAX_INFLIGHT: usize = 64;

/// The first stand-in address (198.18.0.0/15, reserved for benchmarks: no sandbox may
/// reach it, so a stand-in can only mean a name held for approval).
const STAND_IN_BASE: u32 = u32::from_be_bytes([198, 18, 0, 1]);
const STAND_IN_COUNT: u32 = (1 << 17) - 2;

/// The names this sandbox's resolver answered, by address.
#[derive(Debug, Default)]
pub(crate) struct Names {
    by_addr: HashMap<IpAddr, (String, bool)>,
    order: VecDeque<IpAddr>,
    stand_ins: HashMap<String, Ipv4Addr>,
    next_stand_in: u32,
}

impl Names {
    /// The name answered with `addr`, and whether `addr` is a stand-in.
    pub(crate) fn lookup(&self, addr: IpAddr) -> Option<(String, bool)> {
        self.by_addr.get(&addr).cloned()
    }

    fn remember(&mut self, addr: IpAddr, name: &str, stand_in: bool) {
        if self.by_addr.insert(addr, (name.to_owned(), stand_in)).is_none() {
            self.order.push_back(addr);
        }
        while self.order.len() > MAX_NAMES {
            if let Some(old) = self.order.pop_front()
                && let Some((n, true)) = self.by_addr.remove(&old)
            {
                self.stand_ins.remove(&n);
            }
        }
    }

    /// The stand-in address for `name` (the same one each time it is asked).
    fn stand_in(&mut self, name: &str) -> Ipv4Addr {
        if let Some(a) = self.stand_ins.get(name) {
            return *a;
        }
        let a = Ipv4Addr::from(STAND_IN_BASE + self.next_stand_in % STAND_IN_COUNT);
        self.next_stand_in = self.next_stand_in.wrapping_add(1);
        self.stand_ins.insert(name.to_owned(), a);
        self.remember(IpAddr::V4(a), name, true);
        a
    }
}

impl Proxy {
    /// Answers DNS queries arriving on `socket` (UDP 53 on the sandbox's loopback) until
    /// `stop` resolves.
    pub async fn serve_dns(
        self: Arc<Self>,
        socket: std::net::UdpSocket,
        stop: impl Future<Output = ()> + Send,
    ) {
        let socket = match socket
            .set_nonblocking(true)
            .and_then(|()| UdpSocket::from_std(socket))
        {
            Ok(s) => Arc::new(s),
            Err(e) => {
                tracing::error!(error = %e, "the sandbox's resolver cannot serve its socket");
                return;
            }
        };
        let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT));
        let mut tasks = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        let mut buf = vec![0u8; 4096];
        loop {
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                got = socket.recv_from(&mut buf) => match got {
                    Ok((n, peer)) => {
                        let Ok(permit) = Arc::clone(&inflight).try_acquire_owned() else {
                            continue;
                        };
                        let query = buf[..n].to_vec();
                        let proxy = Arc::clone(&self);
                        let socket = Arc::clone(&socket);
                        tasks.spawn(async move {
                            if let Some(answer) = proxy.answer_dns(&query).await {
                                let _ = socket.send_to(&answer, peer).await;
                            }
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "the sandbox's resolver failed to receive");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
            }
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }

    /// The answer to one DNS query (a datagram's bytes), logged; `None` for bytes that
    /// are no DNS message at all (nothing to answer; logged too).
    pub async fn answer_dns(&self, query: &[u8]) -> Option<Vec<u8>> {
        let start = Instant::now();
        let Ok(msg) = Message::from_vec(query) else {
            self.log_dns(start, "", false, "malformed DNS query, not answered".into(), None);
            return None;
        };
        let mut reply = Message::new();
        reply
            .set_id(msg.id())
            .set_message_type(MessageType::Response)
            .set_op_code(msg.op_code())
            .set_recursion_desired(msg.recursion_desired())
            .set_recursion_available(true);
        reply.add_queries(msg.queries().iter().cloned());
        if msg.message_type() != MessageType::Query
            || msg.op_code() != OpCode::Query
            || msg.queries().len() != 1
        {
            reply.set_response_code(ResponseCode::NotImp);
            self.log_dns(
                start,
                "",
                false,
                "not a single standard query, refused".into(),
                None,
            );
            return reply.to_vec().ok();
        }
        let q = &msg.queries()[0];
        let shown = q.name().to_ascii();
        let name = shown.trim_end_matches('.').to_ascii_lowercase();
        let (code, answers, allowed, reason) = self
            .resolve_for_sandbox(&name, q.query_type(), q.query_class())
            .await;
        reply.set_response_code(code);
        let first = answers.first().copied();
        for a in answers {
            reply.add_answer(Record::from_rdata(q.name().clone(), TTL, RData::A(A(a))));
        }
        self.log_dns(start, &name, allowed, reason, first.map(IpAddr::V4));
        reply.to_vec().ok()
    }

    /// The response code, the IPv4 answers, whether the name was allowed and why.
    async fn resolve_for_sandbox(
        &self,
        name: &str,
        qtype: RecordType,
        class: DNSClass,
    ) -> (ResponseCode, Vec<Ipv4Addr>, bool, String) {
        if class != DNSClass::IN {
            return (
                ResponseCode::Refused,
                vec![],
                false,
                format!("class {class} refused"),
            );
        }
        let policy = self.policy();
        let reason = match policy.decide_dns(name) {
            Ok(reason) => reason,
            Err(reason) => {
                if qtype == RecordType::A && Policy::askable(&reason) && self.control().asks().is_some() {
                    let a = self
                        .names
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .stand_in(name);
                    return (
                        ResponseCode::NoError,
                        vec![a],
                        false,
                        format!("{reason}; answered stand-in {a}: a connection to it waits for approval"),
                    );
                }
                return (ResponseCode::NXDomain, vec![], false, reason);
            }
        };
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            return (
                ResponseCode::NoError,
                vec![],
                true,
                format!("{reason}; {qtype} records are not served (A only)"),
            );
        }
        let resolved = timeout(self.limits().connect_timeout, self.resolver.resolve(name, 443)).await;
        let addrs = match resolved {
            Err(_) => {
                return (
                    ResponseCode::ServFail,
                    vec![],
                    false,
                    format!("resolving {name} timed out"),
                );
            }
            Ok(Err(e)) => {
                return (
                    ResponseCode::ServFail,
                    vec![],
                    false,
                    format!("cannot resolve {name}: {e}"),
                );
            }
            Ok(Ok(addrs)) => addrs,
        };
        for &a in &addrs {
            if let Err(why) = policy.check_addr(a) {
                return (
                    ResponseCode::NXDomain,
                    vec![],
                    false,
                    format!("{name} resolves to {why}"),
                );
            }
        }
        let mut v4: Vec<Ipv4Addr> = addrs
            .iter()
            .filter_map(|a| match a {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            })
            .collect();
        v4.dedup();
        {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            for a in &v4 {
                names.remember(IpAddr::V4(*a), name, false);
            }
        }
        if qtype == RecordType::AAAA {
            return (
                ResponseCode::NoError,
                vec![],
                true,
                format!("{reason}; no IPv6 answers (IPv4 only)"),
            );
        }
        let n = v4.len();
        (
            ResponseCode::NoError,
            v4,
            true,
            format!("{reason}; {n} addresses"),
        )
    }

    fn log_dns(&self, start: Instant, name: &str, allowed: bool, reason: String, addr: Option<IpAddr>) {
        self.count_decision(allowed);
        self.push(EgressEntry {
            kind: EgressKind::Dns,
            host: name.to_owned(),
            port: 53,
            addr: addr.map(|a| format_ip(&a)),
            allowed,
            reason,
            bytes_up: 0,
            bytes_down: 0,
            ms: start.elapsed().as_secs_f64() * 1000.0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ProxyLimits, StaticResolver};
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use std::str::FromStr;

    fn proxy(allow: &[&str], ask: bool, names: Arc<StaticResolver>) -> Arc<Proxy> {
        let mut p = airlock_spec::ProxyPolicy::allowing(allow);
        if ask {
            p.on_denied = airlock_spec::OnDenied::Ask;
        }
        let control = crate::Control::new(&p).unwrap();
        Proxy::with_control(control, ProxyLimits::default(), names)
    }

    fn query(name: &str, t: RecordType) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(77).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_str(name).unwrap(), t));
        m.to_vec().unwrap()
    }

    fn answer(p: &Proxy, name: &str, t: RecordType) -> Message {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bytes = rt.block_on(p.answer_dns(&query(name, t))).unwrap();
        Message::from_vec(&bytes).unwrap()
    }

    fn addrs(m: &Message) -> Vec<String> {
        m.answers().iter().map(|r| r.data().to_string()).collect()
    }

    #[test]
    fn an_allowed_name_gets_its_public_addresses_and_others_nxdomain() {
        let names = Arc::new(
            StaticResolver::new()
                .with("pypi.org", &["151.101.0.223".parse().unwrap()])
                .with(
                    "rebind.pypi.org",
                    &[
                        "93.184.215.14".parse().unwrap(),
                        "169.254.169.254".parse().unwrap(),
                    ],
                ),
        );
        let p = proxy(&["pypi.org", "*.pypi.org"], false, names.clone());
        let m = answer(&p, "PyPI.org.", RecordType::A);
        assert_eq!((m.id(), m.response_code()), (77, ResponseCode::NoError));
        assert_eq!(addrs(&m), ["151.101.0.223"]);
        let m = answer(&p, "pypi.org.", RecordType::AAAA);
        assert_eq!((m.response_code(), m.answers().len()), (ResponseCode::NoError, 0));
        let m = answer(&p, "rebind.pypi.org.", RecordType::A);
        assert_eq!(
            m.response_code(),
            ResponseCode::NXDomain,
            "one special address denies the name"
        );
        let m = answer(&p, "example.com.", RecordType::A);
        assert_eq!(m.response_code(), ResponseCode::NXDomain);
        let m = answer(&p, "metadata.google.internal.", RecordType::A);
        assert_eq!(m.response_code(), ResponseCode::NXDomain);
        assert_eq!(
            names.queries(),
            ["pypi.org", "pypi.org", "rebind.pypi.org"],
            "denied names are never looked up"
        );
        let log = p.log();
        assert!(log.iter().all(|e| e.kind == EgressKind::Dns && e.port == 53));
        assert_eq!(log[0].reason, "allowed by pypi.org; 1 addresses");
        assert_eq!(log[3].reason, "not in allowlist");
        assert!(!log[3].allowed);
        assert!(
            log[2].reason.contains("link-local address 169.254.169.254"),
            "{}",
            log[2].reason
        );
        assert_eq!(
            p.names.lock().unwrap().lookup("151.101.0.223".parse().unwrap()),
            Some(("pypi.org".into(), false))
        );
    }

    #[test]
    fn a_tunnel_of_unique_subdomains_reaches_nothing() {
        let names = Arc::new(StaticResolver::new());
        let p = proxy(&["pypi.org"], false, names.clone());
        for i in 0..200 {
            let m = answer(&p, &format!("c2VjcmV0{i:04}.exfil.example."), RecordType::TXT);
            assert_eq!(m.response_code(), ResponseCode::NXDomain);
        }
        assert!(names.queries().is_empty());
        assert_eq!(p.log().iter().filter(|e| !e.allowed).count(), 200);
    }

    #[test]
    fn asking_answers_a_stand_in_without_a_lookup() {
        let names = Arc::new(StaticResolver::new().with("x.example", &["93.184.215.14".parse().unwrap()]));
        let p = proxy(&[], true, names.clone());
        let m = answer(&p, "x.example.", RecordType::A);
        assert_eq!(addrs(&m), ["198.18.0.1"]);
        assert_eq!(
            addrs(&answer(&p, "x.example.", RecordType::A)),
            ["198.18.0.1"],
            "the same each time"
        );
        assert_eq!(addrs(&answer(&p, "y.example.", RecordType::A)), ["198.18.0.2"]);
        assert!(names.queries().is_empty());
        assert_eq!(
            p.names.lock().unwrap().lookup("198.18.0.1".parse().unwrap()),
            Some(("x.example".into(), true))
        );
    }

    #[test]
    fn garbage_and_odd_queries_are_refused_and_logged() {
        let p = proxy(&["pypi.org"], false, Arc::new(StaticResolver::new()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(p.answer_dns(b"\x00\x01garbage")), None);
        let mut two = Message::new();
        two.add_query(Query::query(Name::from_str("a.").unwrap(), RecordType::A));
        two.add_query(Query::query(Name::from_str("b.").unwrap(), RecordType::A));
        let bytes = rt.block_on(p.answer_dns(&two.to_vec().unwrap())).unwrap();
        assert_eq!(
            Message::from_vec(&bytes).unwrap().response_code(),
            ResponseCode::NotImp
        );
        assert_eq!(p.log().len(), 2);
    }
}
