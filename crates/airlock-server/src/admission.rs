//! Admission control: at most `max_sandboxes` live at once, the sum of admitted memory
//! within the memory budget, and a per-API-key concurrency cap. A one-shot exec is
//! admitted at its memory cap; a namespace session at its idle charge, and each exec in
//! it holds the rest of its cap for the exec's life ([`Admission::reserve`]; see
//! docs/service.md, "Capacity"). Beyond that a
//! request waits in a bounded queue up to the queue timeout, then gets a 429 with
//! Retry-After. Nothing here can fail with a 5xx.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ServerConfig;
use crate::error::ApiError;
use airlock_backend::Backend;

/// Memory is admitted in MiB units (semaphore permits).
const MIB: u64 = 1 << 20;

/// What an admitted request holds; dropping it releases the capacity.
#[derive(Debug)]
pub struct Permit {
    _slot: OwnedSemaphorePermit,
    _memory: OwnedSemaphorePermit,
    _key: Option<OwnedSemaphorePermit>,
}

/// Memory held beyond a session's idle charge while one of its execs runs; dropping it
/// gives the memory back.
#[derive(Debug)]
pub struct Reserve {
    _memory: Option<OwnedSemaphorePermit>,
}

/// The admission gate.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    memory_mib: Arc<Semaphore>,
    per_key: Mutex<HashMap<String, Arc<Semaphore>>>,
    per_key_cap: usize,
    waiting: AtomicUsize,
    max_queue: usize,
    queue_timeout: Duration,
    /// Memory the backends hold outside any sandbox (VM templates): re-read at each
    /// admission and reserved from `memory_mib`, so the budget bounds it too.
    holders: Vec<Arc<dyn Backend>>,
    /// MiB of `memory_mib` reserved for `holders` now (permits taken out of it).
    held_mib: Mutex<u64>,
}

/// Why a request was not admitted (the `reason` label of `airlock_rejected_total`).
pub const QUEUE_FULL: &str = "queue_full";
/// The queue timeout passed.
pub const QUEUE_TIMEOUT: &str = "queue_timeout";
/// The API key's concurrency cap is reached.
pub const KEY_CONCURRENCY: &str = "key_concurrency";
/// The API key (or the anonymous caller) holds `--max-sessions-per-key` sessions already.
pub const SESSION_QUOTA: &str = "session_quota";

/// Sessions held, and being created, per API key (`None`: the anonymous caller of a
/// service without keys). Checked before admission: a caller at its quota gets a 429 at
/// once instead of taking a slot another caller could use.
#[derive(Debug)]
pub struct SessionQuota {
    held: Arc<Mutex<HashMap<Option<String>, usize>>>,
    cap: usize,
}

/// One session's place in its key's quota; dropping it gives the place back.
#[derive(Debug)]
pub struct SessionSlot {
    held: Arc<Mutex<HashMap<Option<String>, usize>>>,
    key: Option<String>,
}

impl SessionQuota {
    /// A quota of `cap` sessions per key.
    pub fn new(cap: usize) -> SessionQuota {
        SessionQuota {
            held: Arc::new(Mutex::new(HashMap::new())),
            cap,
        }
    }

    /// The quota.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A place for one more session of `key`, or `None` when it holds `cap` already.
    pub fn reserve(&self, key: Option<&str>) -> Option<SessionSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(key.map(str::to_owned)).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(SessionSlot {
            held: Arc::clone(&self.held),
            key: key.map(str::to_owned),
        })
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Admission {
    /// A gate sized by `config`.
    pub fn new(config: &ServerConfig) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(config.max_sandboxes)),
            memory_mib: Arc::new(Semaphore::new((config.memory_budget / MIB) as usize)),
            per_key: Mutex::new(HashMap::new()),
            per_key_cap: config.per_key_concurrency,
            waiting: AtomicUsize::new(0),
            max_queue: config.max_queue,
            queue_timeout: config.queue_timeout,
            holders: Vec::new(),
            held_mib: Mutex::new(0),
        }
    }

    /// The gate, with what `backends` hold outside their sandboxes
    /// ([`Backend::held_bytes`]) reserved from the memory budget.
    pub fn holding(mut self, backends: Vec<Arc<dyn Backend>>) -> Admission {
        self.holders = backends;
        self
    }

    /// Moves the reservation for what the backends hold to what they hold now: more is
    /// taken from the budget's free memory (what is not free now is taken at later
    /// admissions, as sandboxes give theirs back), less is given back. Returns the MiB
    /// reserved.
    pub fn reserve_held(&self) -> u64 {
        let want = self
            .holders
            .iter()
            .map(|b| b.held_bytes())
            .sum::<u64>()
            .div_ceil(MIB);
        let mut held = self.held_mib.lock().unwrap_or_else(|e| e.into_inner());
        if want > *held {
            *held += self.memory_mib.forget_permits((want - *held) as usize) as u64;
        } else if want < *held {
            self.memory_mib.add_permits((*held - want) as usize);
            *held = want;
        }
        *held
    }

    /// Sandboxes admitted now.
    pub fn active(&self, max: usize) -> usize {
        max - self.slots.available_permits()
    }

    /// Sandboxes that could be admitted now (`/readyz`'s capacity for a fleet's router).
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// Memory (in bytes) of the budget no admitted sandbox holds now.
    pub fn free_memory(&self) -> u64 {
        self.memory_mib.available_permits() as u64 * MIB
    }

    /// Requests waiting for admission now.
    pub fn queued(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for `memory_bytes` more of the budget (no slot: the session has one), up to
    /// the queue timeout like [`Admission::admit`]; on refusal the error is a 429.
    pub async fn reserve(&self, memory_bytes: u64) -> Result<Reserve, ApiError> {
        let mib = u32::try_from(memory_bytes.div_ceil(MIB)).unwrap_or(u32::MAX);
        if mib == 0 {
            return Ok(Reserve { _memory: None });
        }
        let retry = self.queue_timeout.as_secs().max(1);
        // Templates made since the last admission come out of the budget first.
        self.reserve_held();
        // Taken at once when the budget has room: no place in the queue needed.
        if let Ok(p) = Arc::clone(&self.memory_mib).try_acquire_many_owned(mib) {
            return Ok(Reserve { _memory: Some(p) });
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::rate_limited(
                QUEUE_FULL,
                "too many requests are waiting; retry later",
                retry,
            ));
        }
        let wait = Arc::clone(&self.memory_mib).acquire_many_owned(mib);
        let result = tokio::time::timeout(self.queue_timeout, wait).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match result {
            Ok(Ok(p)) => Ok(Reserve { _memory: Some(p) }),
            _ => Err(ApiError::rate_limited(
                QUEUE_TIMEOUT,
                format!(
                    "waited {} ms for the memory budget to hold this session's memory cap while the exec runs; retry later",
                    self.queue_timeout.as_millis()
                ),
                retry,
            )),
        }
    }

    /// Waits for room for one sandbox with `memory_bytes` cap; returns the permit and
    /// how long it waited. On refusal the error is a 429 whose code is the reason.
    pub async fn admit(&self, key: Option<&str>, memory_bytes: u64) -> Result<(Permit, Duration), ApiError> {
        let t0 = Instant::now();
        let retry = self.queue_timeout.as_secs().max(1);
        let key_sem = key.map(|k| {
            let mut map = self.per_key.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(
                map.entry(k.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_key_cap))),
            )
        });
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::rate_limited(
                QUEUE_FULL,
                "too many requests are waiting; retry later",
                retry,
            ));
        }
        // Templates made since the last admission come out of the budget first.
        self.reserve_held();
        let mib = memory_bytes.div_ceil(MIB) as u32;
        let wait = async {
            let key_permit = match &key_sem {
                Some(sem) => Some(
                    Arc::clone(sem)
                        .acquire_owned()
                        .await
                        .map_err(|_| KEY_CONCURRENCY)?,
                ),
                None => None,
            };
            let slot = Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|_| QUEUE_TIMEOUT)?;
            let memory = Arc::clone(&self.memory_mib)
                .acquire_many_owned(mib)
                .await
                .map_err(|_| QUEUE_TIMEOUT)?;
            Ok::<_, &'static str>(Permit {
                _slot: slot,
                _memory: memory,
                _key: key_permit,
            })
        };
        let result = tokio::time::timeout(self.queue_timeout, wait).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match result {
            Ok(Ok(permit)) => Ok((permit, t0.elapsed())),
            Ok(Err(reason)) => Err(ApiError::rate_limited(
                reason,
                "the service is at capacity; retry later",
                retry,
            )),
            Err(_) => {
                let (reason, what) = match &key_sem {
                    Some(sem) if sem.available_permits() == 0 => {
                        (KEY_CONCURRENCY, "this API key's concurrency cap")
                    }
                    _ => (QUEUE_TIMEOUT, "capacity"),
                };
                Err(ApiError::rate_limited(
                    reason,
                    format!(
                        "waited {} ms for {what}; retry later",
                        self.queue_timeout.as_millis()
                    ),
                    retry,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reserve_holds_budget_until_dropped() {
        let config = ServerConfig {
            memory_budget: 64 * MIB,
            max_sandboxes: 100,
            queue_timeout: Duration::from_millis(50),
            ..ServerConfig::default()
        };
        let a = Admission::new(&config);
        let (idle, _) = a.admit(None, 4 * MIB).await.unwrap();
        let r = a.reserve(60 * MIB).await.unwrap();
        assert_eq!(a.free_memory(), 0);
        let e = a.admit(None, MIB).await.unwrap_err();
        assert_eq!(e.code, QUEUE_TIMEOUT);
        assert_eq!(a.reserve(MIB).await.unwrap_err().code, QUEUE_TIMEOUT);
        drop(r);
        assert_eq!(a.free_memory(), 60 * MIB);
        assert!(a.reserve(0).await.is_ok());
        drop(idle);
        assert_eq!(a.free_memory(), 64 * MIB);
    }

    #[test]
    fn session_quota_is_per_key_and_given_back() {
        let q = SessionQuota::new(2);
        let a1 = q.reserve(Some("a")).unwrap();
        let _a2 = q.reserve(Some("a")).unwrap();
        assert!(q.reserve(Some("a")).is_none(), "a third session for key a");
        // Another key, and the anonymous caller, have quotas of their own.
        let _b = q.reserve(Some("b")).unwrap();
        let _anon = q.reserve(None).unwrap();
        drop(a1);
        assert!(q.reserve(Some("a")).is_some(), "the place was not given back");
    }
}
