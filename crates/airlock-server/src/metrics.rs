//! Prometheus metrics, with conventional names and units (seconds, `_total` counters).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// `{outcome}` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// exited, signaled, timeout, oom, error.
    pub outcome: String,
}

/// `{isolation, pool}` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// The tier: namespaces, gvisor or microvm.
    pub isolation: String,
    /// warm or cold.
    pub pool: String,
}

/// `{isolation}` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// The tier: namespaces, gvisor or microvm.
    pub isolation: String,
}

/// `{isolation, image}` labels: an image pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImagePoolLabel {
    /// The tier: namespaces, gvisor or microvm.
    pub isolation: String,
    /// The image, as `--pool IMAGE=N` named it.
    pub image: String,
}

/// `{decision}` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// allowed or denied.
    pub decision: String,
}

/// `{reason}` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why the request was rejected.
    pub reason: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Every metric the service exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Execs by outcome.
    pub exec_total: Family<OutcomeLabel, Counter>,
    /// Exec wall time (program start to end).
    pub exec_duration: Histogram,
    /// Provisioning time by tier and pool (warm: built ahead; cold: built for the
    /// request).
    pub provision: HistFamily<PoolLabel>,
    /// Sandboxes live now (execs running plus sessions).
    pub sandboxes_active: Gauge,
    /// Warm sandboxes ready, by tier.
    pub pool_ready: Family<TierLabel, Gauge>,
    /// Warm sandboxes of an image ready, by tier and image (`--pool IMAGE=N`).
    pub image_pool_ready: Family<ImagePoolLabel, Gauge>,
    /// Requests refused, by reason.
    pub rejected: Family<ReasonLabel, Counter>,
    /// Time spent waiting for admission.
    pub queue_wait: Histogram,
    /// Egress proxy decisions.
    pub egress: Family<DecisionLabel, Counter>,
}

impl Metrics {
    /// Registers everything.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let exec_total = Family::<OutcomeLabel, Counter>::default();
        let exec_duration = latency_histogram();
        let provision = HistFamily::<PoolLabel>::new_with_constructor(latency_histogram);
        let sandboxes_active = Gauge::default();
        let pool_ready = Family::<TierLabel, Gauge>::default();
        let image_pool_ready = Family::<ImagePoolLabel, Gauge>::default();
        let rejected = Family::<ReasonLabel, Counter>::default();
        let queue_wait = latency_histogram();
        let egress = Family::<DecisionLabel, Counter>::default();
        registry.register("airlock_exec", "Execs by outcome", exec_total.clone());
        registry.register(
            "airlock_exec_duration_seconds",
            "Wall time of execs, program start to end",
            exec_duration.clone(),
        );
        registry.register(
            "airlock_provision_seconds",
            "Time to build a sandbox, by isolation (warm: ahead of time for the pool; cold: for the request)",
            provision.clone(),
        );
        registry.register(
            "airlock_sandboxes_active",
            "Sandboxes live now",
            sandboxes_active.clone(),
        );
        registry.register(
            "airlock_pool_ready",
            "Warm sandboxes ready, by isolation",
            pool_ready.clone(),
        );
        registry.register(
            "airlock_image_pool_ready",
            "Warm sandboxes of an image ready, by isolation and image",
            image_pool_ready.clone(),
        );
        registry.register(
            "airlock_rejected",
            "Requests refused, by reason",
            rejected.clone(),
        );
        registry.register(
            "airlock_queue_wait_seconds",
            "Time requests waited for admission",
            queue_wait.clone(),
        );
        registry.register(
            "airlock_egress",
            "Egress proxy decisions (connections or requests)",
            egress.clone(),
        );
        Metrics {
            registry,
            exec_total,
            exec_duration,
            provision,
            sandboxes_active,
            pool_ready,
            image_pool_ready,
            rejected,
            queue_wait,
            egress,
        }
    }

    /// Records a sandbox of `tier` built for `pool` ("warm" or "cold").
    pub fn provisioned(&self, tier: airlock_spec::Isolation, pool: &str, took: Duration) {
        self.provision
            .get_or_create(&PoolLabel {
                isolation: tier.as_str().into(),
                pool: pool.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Sets how many sandboxes of `tier` its pool has ready.
    pub fn pool_ready(&self, tier: airlock_spec::Isolation, ready: usize) {
        self.pool_ready
            .get_or_create(&TierLabel {
                isolation: tier.as_str().into(),
            })
            .set(ready as i64);
    }

    /// Sets the ready gauge of `tier`'s pool of `image`.
    pub fn image_pool_ready(&self, tier: airlock_spec::Isolation, image: &str, ready: usize) {
        self.image_pool_ready
            .get_or_create(&ImagePoolLabel {
                isolation: tier.as_str().into(),
                image: image.into(),
            })
            .set(ready as i64);
    }

    /// Counts a refused request.
    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an exec.
    pub fn exec(&self, outcome: &str, wall: Duration) {
        self.exec_total
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
        self.exec_duration.observe(wall.as_secs_f64());
    }

    /// Counts the egress decisions of one exec.
    pub fn egress(&self, entries: &[airlock_spec::EgressEntry]) {
        for e in entries {
            let decision = if e.allowed { "allowed" } else { "denied" };
            self.egress
                .get_or_create(&DecisionLabel {
                    decision: decision.into(),
                })
                .inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_units() {
        let m = Metrics::new();
        m.exec("exited", Duration::from_millis(3));
        m.reject("queue_full");
        m.provisioned(
            airlock_spec::Isolation::Namespaces,
            "warm",
            Duration::from_millis(5),
        );
        m.pool_ready(airlock_spec::Isolation::Microvm, 2);
        m.egress(&[airlock_spec::EgressEntry {
            kind: airlock_spec::EgressKind::Proxy,
            host: "metadata".into(),
            port: 80,
            addr: None,
            allowed: false,
            reason: "cloud metadata name".into(),
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.1,
        }]);
        let text = m.render();
        for name in [
            "airlock_exec_total{outcome=\"exited\"} 1",
            "airlock_exec_duration_seconds_bucket",
            "airlock_provision_seconds_count{isolation=\"namespaces\",pool=\"warm\"} 1",
            "airlock_sandboxes_active",
            "airlock_pool_ready{isolation=\"microvm\"} 2",
            "airlock_rejected_total{reason=\"queue_full\"} 1",
            "airlock_queue_wait_seconds_count",
            "airlock_egress_total{decision=\"denied\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing in:\n{text}");
        }
    }
}
