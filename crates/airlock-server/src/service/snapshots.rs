//! Snapshots of sessions, and what is built on them: a session restored in place, new
//! sessions from a snapshot, forks, and pauses.
//!
//! A snapshot always holds the session's writable filesystem (the tier's
//! `export_files`, stored by airlock-snapshot's store, deduplicated per API key), and,
//! where the tier can, its memory and processes (`checkpoint`: "full"). The store
//! outlives the daemon; sessions do not.

use airlock_backend::{Purpose, Shape};
use airlock_snapshot::{NewSnapshot, Record, Store, StoreError};
use airlock_spec::{Isolation, Limits, NetworkPolicy};
use serde::{Deserialize, Serialize};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::api::{ForkRequest, SnapshotKindRequest};
use crate::error::ApiError;
use crate::state::{AppState, KeyName, Paused, Session};

/// What the server records with each snapshot (the store keeps it opaque): enough to
/// build a session like the one it came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Attributes {
    /// The tier the session ran on.
    pub isolation: Isolation,
    /// The image it ran (`None`: the host's system directories).
    pub image: Option<ImageRef>,
    /// Its limits.
    pub limits: Limits,
    /// Its network policy, secrets' values removed (snapshots never hold a secret).
    pub network: NetworkPolicy,
    /// The names of the secrets whose values were removed.
    #[serde(default)]
    pub secrets_removed: Vec<String>,
}

/// An image as a snapshot records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ImageRef {
    /// The name the session resolved it under.
    pub name: String,
    /// Its manifest digest: what must match on restore.
    pub digest: String,
}

/// A snapshot as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotView {
    snapshot_id: String,
    kind: String,
    sandbox_id: String,
    isolation: Isolation,
    image: Option<ImageRef>,
    created_at: f64,
    bytes: u64,
    stored_bytes: u64,
    files: u64,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotList {
    snapshots: Vec<SnapshotView>,
    used_bytes: u64,
    budget_bytes: u64,
}

impl SnapshotView {
    /// The record `r` as the API shows it on the node `node` (its id after `NAME--`).
    fn of(r: &Record, node: Option<&str>) -> Result<SnapshotView, ApiError> {
        let a = attributes(r)?;
        Ok(SnapshotView {
            snapshot_id: crate::node::qualify(node, &r.id),
            kind: kind_name(r.kind).to_owned(),
            sandbox_id: r.session.clone(),
            isolation: a.isolation,
            image: a.image,
            created_at: r.created,
            bytes: r.bytes,
            stored_bytes: r.stored_bytes,
            files: r.files,
        })
    }
}

/// A snapshot kind's name in the API.
fn kind_name(kind: airlock_snapshot::SnapshotKind) -> &'static str {
    match kind {
        airlock_snapshot::SnapshotKind::Filesystem => "filesystem",
        airlock_snapshot::SnapshotKind::Full => "full",
    }
}

fn attributes(r: &Record) -> Result<Attributes, ApiError> {
    serde_json::from_value(r.attributes.clone())
        .map_err(|e| ApiError::internal(format!("snapshot {}: its record is unreadable: {e}", r.id)))
}

/// The service's store, or why there is none (503).
pub(crate) fn store(state: &AppState) -> Result<Arc<Store>, ApiError> {
    match &state.snapshots {
        Ok(store) => Ok(Arc::clone(store)),
        Err(why) => Err(ApiError::snapshots_unavailable(format!(
            "snapshots are unavailable: {why}"
        ))),
    }
}

/// Opens the store at `dir` (at the service's start): its failure leaves the service
/// running without snapshots, saying why.
pub(crate) fn open_store(dir: Option<&std::path::Path>, budget: u64) -> Result<Arc<Store>, String> {
    let Some(dir) = dir else {
        return Err("this service has no snapshot store (--snapshot-dir)".into());
    };
    match Store::open(dir, budget) {
        Ok(store) => Ok(Arc::new(store)),
        Err(e) => {
            let why = format!("--snapshot-dir {}: {e}", dir.display());
            tracing::warn!("{why}; snapshots are unavailable");
            Err(why)
        }
    }
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Budget { needed, used, budget } => ApiError::snapshot_budget(format!(
            "the snapshot needs {} more on disk; snapshots use {} of the {} budget (--snapshot-budget): delete some (GET /v1/snapshots lists them)",
            airlock_spec::format_size(needed),
            airlock_spec::format_size(used),
            airlock_spec::format_size(budget)
        )),
        StoreError::NotFound(id) => ApiError::not_found(format!("no snapshot {id}")),
        e => ApiError::internal(format!("snapshot store: {e}")),
    }
}

/// The snapshot `id` (as the API names it) if `key` owns it (404 otherwise, whoever owns
/// it, and for an id of another node); the record holds the store's own id.
pub(crate) fn record(state: &AppState, key: &KeyName, id: &str) -> Result<Record, ApiError> {
    let store = store(state)?;
    crate::node::local(state.config.node.as_deref(), id)
        .and_then(|local| store.get(local))
        .filter(|r| r.owner == key.0)
        .ok_or_else(|| ApiError::not_found(format!("no snapshot {id} (GET /v1/snapshots lists yours)")))
}

/// The session's network policy now: a policy changed while it ran (`PATCH …/network`,
/// an approval for the session) is what its snapshots and forks get, never the one it was
/// created with; its secrets (which cannot change live) from its creation.
pub(crate) fn live_network(session: &Session) -> NetworkPolicy {
    match (&session.egress, &session.network) {
        (Some(proxy), NetworkPolicy::Proxy(created)) => {
            let mut now = proxy.control().shown();
            now.secrets = created.secrets.clone();
            NetworkPolicy::Proxy(now)
        }
        _ => session.network.clone(),
    }
}

/// What a session is, as a snapshot records it.
fn attributes_of(session: &Session) -> Attributes {
    let mut network = live_network(session);
    let mut secrets_removed = Vec::new();
    if let NetworkPolicy::Proxy(p) = &mut network {
        for s in &mut p.secrets {
            secrets_removed.push(s.name.clone());
            s.value.clear();
        }
    }
    Attributes {
        isolation: session.isolation,
        image: session.image.as_ref().map(|i| ImageRef {
            name: i.name.clone(),
            digest: i.root.digest.clone(),
        }),
        limits: session.limits.clone(),
        network,
        secrets_removed,
    }
}

/// Takes a snapshot of `session` (blocking the session's other work while it runs).
pub(crate) async fn snapshot(
    state: &Arc<AppState>,
    key: &KeyName,
    session: &Arc<Session>,
    kind: SnapshotKindRequest,
) -> Result<SnapshotView, ApiError> {
    let store = store(state)?;
    let tier = state.tiers.get(session.isolation)?;
    if kind == SnapshotKindRequest::Full && !tier.backend.checkpoints() {
        return Err(ApiError::invalid(
            "kind",
            format!(
                "full snapshots (memory and processes) are not available with isolation {}: ask for \"filesystem\" (or \"auto\")",
                session.isolation.as_str()
            ),
        ));
    }
    let new = NewSnapshot {
        owner: key.0.clone(),
        session: session.id.clone(),
        attributes: serde_json::to_value(attributes_of(session))
            .map_err(|e| ApiError::internal(format!("snapshot attributes: {e}")))?,
        full: None,
    };
    let staging = if kind != SnapshotKindRequest::Filesystem && tier.backend.checkpoints() {
        Some(
            store
                .staging()
                .map_err(|e| ApiError::internal(format!("snapshot store: {e}")))?,
        )
    } else {
        None
    };
    let cancel = Arc::clone(&session.cancel);
    let paused = session.pause_state() != Paused::No;
    let spawner = Arc::clone(&tier.spawner);
    let full = staging.is_some();
    let work = move |sb: &mut dyn airlock_backend::Sandbox| -> Result<Record, ApiError> {
        // A paused sandbox is thawed for as long as its snapshot takes (a tier's agent
        // does the work inside it), and frozen again after.
        if paused {
            sb.resume()?;
        }
        let taken = (|| {
            let mut new = new;
            if let Some(staging) = staging
                && sb.checkpoint(staging.path())?
            {
                new.full = Some(staging);
            }
            export_into(&store, new, sb, cancel.as_fd())
        })();
        if paused {
            sb.pause()?;
        }
        taken
    };
    // A checkpoint may start the sandbox again (gVisor): on a thread that lives as long
    // as the service, as its processes must.
    let record = if full {
        session.with_sandbox_on(spawner, work).await??
    } else {
        session.with_sandbox(work).await??
    };
    tracing::info!(id = %session.id, snapshot = %record.id, kind = kind_name(record.kind), bytes = record.bytes, stored = record.stored_bytes, "snapshot taken");
    SnapshotView::of(&record, state.config.node.as_deref())
}

/// Streams `sb`'s files into the store as `new`, the export and the store's reading
/// running side by side through a pipe.
fn export_into(
    store: &Store,
    new: NewSnapshot,
    sb: &mut dyn airlock_backend::Sandbox,
    cancel: std::os::fd::BorrowedFd<'_>,
) -> Result<Record, ApiError> {
    let (mut reader, mut writer) = std::io::pipe().map_err(|e| ApiError::internal(format!("pipe: {e}")))?;
    std::thread::scope(|scope| {
        let put = scope.spawn(move || store.put(new, &mut reader));
        let exported = sb.export_files(&mut writer, &[cancel]);
        drop(writer);
        let put = put
            .join()
            .map_err(|_| ApiError::internal("the snapshot store's writer panicked"))?;
        // The store's refusal (over budget) explains a failed export (its pipe closed);
        // an export's failure explains a store that saw a cut stream.
        match (exported, put) {
            (Ok(()), Ok(record)) => Ok(record),
            (_, Err(e @ StoreError::Budget { .. })) => Err(store_error(e)),
            (Err(e), _) => Err(e.into()),
            (Ok(()), Err(e)) => Err(store_error(e)),
        }
    })
}

/// Rolls `session` back to the snapshot `id`'s files: its background processes,
/// terminals and kernel end first (what they held belongs to the time after the
/// snapshot).
pub(crate) async fn restore(
    state: &Arc<AppState>,
    key: &KeyName,
    session: &Arc<Session>,
    id: &str,
) -> Result<(), ApiError> {
    let store = store(state)?;
    let record = record(state, key, id)?;
    let a = attributes(&record)?;
    let ours = session.image.as_ref().map(|i| i.root.digest.as_str());
    let theirs = a.image.as_ref().map(|i| i.digest.as_str());
    if ours != theirs {
        let name = |i: Option<&ImageRef>| {
            i.map_or("the host's system directories".to_owned(), |i| {
                format!("image {} ({})", i.name, i.digest)
            })
        };
        let current = session.image.as_ref().map(|i| ImageRef {
            name: i.name.clone(),
            digest: i.root.digest.clone(),
        });
        return Err(ApiError::incompatible_snapshot(format!(
            "snapshot {id} was taken on {}, this sandbox runs {}: restore it into a new sandbox (POST /v1/sandboxes {{\"from_snapshot\": \"{id}\"}})",
            name(a.image.as_ref()),
            name(current.as_ref())
        )));
    }
    end_programs(session).await;
    let tar = store.tar(&record.id).map_err(store_error)?;
    let cancel = Arc::clone(&session.cancel);
    session
        .with_sandbox(move |sb| {
            let mut tar = tar;
            sb.import_files(&mut tar, &[cancel.as_fd()])
        })
        .await?
        .map_err(ApiError::from)?;
    tracing::info!(id = %session.id, snapshot = %id, "session restored");
    Ok(())
}

/// Ends every background process, terminal and the kernel of `session`.
async fn end_programs(session: &Arc<Session>) {
    if let Some(kernel) = session.kernel.lock().await.take() {
        kernel.kill().await;
    }
    session.processes.kill_all().await;
}

/// Where a new session's contents come from.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// Nothing: a fresh sandbox.
    Fresh,
    /// A stored snapshot's files.
    Snapshot(String),
    /// A tar stream in memory (a fork's parent's files).
    Files(Arc<Vec<u8>>),
    /// A full snapshot's directory (a stored one, or a fork's staging).
    Full(PathBuf, Option<String>),
}

/// Builds the sandbox of a new session of `shape` from `origin` (blocking work off the
/// async threads): a restored full snapshot, or a fresh one with files imported.
pub(crate) async fn build(
    state: &Arc<AppState>,
    tier: &crate::tier::Tier,
    shape: &Shape,
    origin: &Origin,
) -> Result<Box<dyn airlock_backend::Sandbox>, ApiError> {
    if let Origin::Full(dir, _) = origin {
        // Restored on a spawner thread: the sandbox's processes die with the thread that
        // started them.
        let (shape, dir) = (shape.clone(), dir.clone());
        return tier
            .spawner
            .run(move |backend| {
                let mut sb = backend.restore(&shape, &dir, Purpose::Session)?;
                sb.open_session(&shape)?;
                Ok::<_, airlock_backend::Error>(sb)
            })
            .await?
            .map_err(ApiError::from);
    }
    let sandbox = tier.for_session(shape, &state.metrics).await?;
    let tar: Box<dyn std::io::Read + Send> = match origin {
        Origin::Fresh | Origin::Full(..) => return Ok(sandbox),
        Origin::Snapshot(id) => store(state)?.tar(id).map_err(store_error)?,
        Origin::Files(bytes) => Box::new(std::io::Cursor::new(SharedBytes(Arc::clone(bytes)))),
    };
    let (imported, sandbox) = tokio::task::spawn_blocking(move || {
        let mut sandbox = sandbox;
        let mut tar = tar;
        (sandbox.import_files(&mut tar, &[]), sandbox)
    })
    .await
    .map_err(|e| ApiError::internal(format!("import task: {e}")))?;
    if let Err(e) = imported {
        let _ = tokio::task::spawn_blocking(move || drop(sandbox)).await;
        return Err(e.into());
    }
    Ok(sandbox)
}

/// Bytes shared between the forks that read them.
struct SharedBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Makes `req.count` new sessions, each a copy of `parent` now: from a full checkpoint
/// where the tier takes one (memory and processes too), else from its files. All or
/// nothing: when one cannot be made, those made are deleted.
pub(crate) async fn fork(
    state: &Arc<AppState>,
    key: &KeyName,
    parent: &Arc<Session>,
    req: &ForkRequest,
) -> Result<Vec<Arc<Session>>, ApiError> {
    let max = state.config.max_fork;
    if req.count == 0 || req.count > max as u64 {
        return Err(ApiError::invalid(
            "count",
            format!(
                "must be between 1 and {max} (this server's --max-fork), got {}",
                req.count
            ),
        ));
    }
    let tier = state.tiers.get(parent.isolation)?;
    let cancel = Arc::clone(&parent.cancel);
    // A full checkpoint's staging directory lives until every fork is restored from it
    // (each then holds what it still needs open), and goes with this function.
    let mut staging = None;
    if tier.backend.checkpoints() {
        let stage = store(state).and_then(|s| {
            s.staging()
                .map_err(|e| ApiError::internal(format!("snapshot store: {e}")))
        })?;
        let dir = stage.path().to_owned();
        let spawner = Arc::clone(&tier.spawner);
        if parent
            .with_sandbox_on(spawner, move |sb| sb.checkpoint(&dir))
            .await??
        {
            staging = Some(stage);
        }
    }
    let origin = match &staging {
        Some(stage) => Origin::Full(stage.path().to_owned(), None),
        None => files_of(parent, cancel).await?,
    };
    let plan = super::sessions::Plan {
        ttl_s: req.ttl_s,
        limits: parent.limits.clone(),
        network: live_network(parent),
        isolation: parent.isolation,
        image: parent.image.as_ref().map(|i| i.root.digest.clone()),
        image_name: parent.image.as_ref().map(|i| i.name.clone()),
        on_idle: parent.on_idle,
        idle_timeout: parent.idle_timeout,
        origin: origin.clone(),
    };
    let made = futures_util::future::join_all(
        (0..req.count).map(|_| super::sessions::open(state, key, plan.clone())),
    )
    .await;
    let (ok, failed): (Vec<_>, Vec<_>) = made.into_iter().partition(Result::is_ok);
    let ok: Vec<Arc<Session>> = ok.into_iter().filter_map(Result::ok).collect();
    if let Some(Err(e)) = failed.into_iter().next() {
        for s in ok {
            let _ = super::sessions::delete_session(state, key, &s.id).await;
        }
        return Err(e);
    }
    drop(staging);
    tracing::info!(id = %parent.id, count = ok.len(), "session forked");
    Ok(ok)
}

/// `parent`'s files as a tar stream in memory.
async fn files_of(parent: &Arc<Session>, cancel: Arc<std::os::fd::OwnedFd>) -> Result<Origin, ApiError> {
    let paused = parent.pause_state() != Paused::No;
    let bytes = parent
        .with_sandbox(move |sb| -> Result<Vec<u8>, airlock_backend::Error> {
            if paused {
                sb.resume()?;
            }
            let mut out = Vec::new();
            let exported = sb.export_files(&mut out, &[cancel.as_fd()]);
            if paused {
                sb.pause()?;
            }
            exported.map(|()| out)
        })
        .await??;
    Ok(Origin::Files(Arc::new(bytes)))
}

/// Lists `key`'s snapshots, oldest first, with the store's usage.
pub(crate) fn list(state: &AppState, key: &KeyName) -> Result<SnapshotList, ApiError> {
    let store = store(state)?;
    let mut records: Vec<Record> = store.list().into_iter().filter(|r| r.owner == key.0).collect();
    records.sort_by(|a, b| a.created.total_cmp(&b.created));
    let usage = store.usage();
    Ok(SnapshotList {
        snapshots: records
            .iter()
            .map(|r| SnapshotView::of(r, state.config.node.as_deref()))
            .collect::<Result<_, _>>()?,
        used_bytes: usage.used_bytes,
        budget_bytes: usage.budget_bytes,
    })
}

/// The snapshot `id` of `key`.
pub(crate) fn show(state: &AppState, key: &KeyName, id: &str) -> Result<SnapshotView, ApiError> {
    SnapshotView::of(&record(state, key, id)?, state.config.node.as_deref())
}

/// Deletes the snapshot `id` of `key`, freeing what no other snapshot shares.
pub(crate) fn delete(state: &AppState, key: &KeyName, id: &str) -> Result<(), ApiError> {
    let record = record(state, key, id)?;
    store(state)?.delete(&record.id).map_err(store_error)?;
    tracing::info!(snapshot = %id, "snapshot deleted");
    Ok(())
}

/// The plan of a session made from the snapshot `req.from_snapshot`.
pub(crate) fn plan_from(
    state: &AppState,
    key: &KeyName,
    req: &crate::api::CreateSandboxRequest,
    id: &str,
) -> Result<super::sessions::Plan, ApiError> {
    let record = record(state, key, id)?;
    let a = attributes(&record)?;
    if req.isolation.is_some_and(|i| i != a.isolation) {
        return Err(ApiError::invalid(
            "isolation",
            format!(
                "snapshot {id} was taken with isolation {}; a session from it runs there (leave isolation out)",
                a.isolation.as_str()
            ),
        ));
    }
    if req.image.is_some() {
        return Err(ApiError::invalid(
            "image",
            format!("a session from snapshot {id} runs the snapshot's image (leave image out)"),
        ));
    }
    let network = match &req.network {
        Some(n) => n.clone(),
        None if !a.secrets_removed.is_empty() => {
            return Err(ApiError::invalid(
                "network",
                format!(
                    "snapshot {id}'s sandbox had secrets ({}), whose values snapshots never store: give the network policy again, with them",
                    a.secrets_removed.join(", ")
                ),
            ));
        }
        None => a.network.clone(),
    };
    let limits = if req.limits == Default::default() {
        a.limits.clone()
    } else {
        crate::api::limits(&req.limits, &state.config, &a.limits)?
    };
    // The store's own id from here on (the session's `from_snapshot` names it as the API does).
    let origin = match store(state)?.full_dir(&record.id) {
        Some(dir) => Origin::Full(dir, Some(record.id.clone())),
        None => Origin::Snapshot(record.id.clone()),
    };
    Ok(super::sessions::Plan {
        ttl_s: req.ttl_s,
        limits,
        network,
        isolation: a.isolation,
        image: a.image.as_ref().map(|i| i.digest.clone()),
        image_name: a.image.as_ref().map(|i| i.name.clone()),
        on_idle: req.on_idle.unwrap_or_default(),
        idle_timeout: std::time::Duration::from_secs(req.idle_timeout_s.unwrap_or(60)),
        origin,
    })
}

/// Pauses sessions that asked to be paused when idle and have been (called by the
/// reaper); a session busy with an exec is left for the next round.
pub(crate) fn pause_idle(state: &Arc<AppState>) {
    let now = std::time::Instant::now();
    let idle: Vec<Arc<Session>> = state
        .sessions
        .lock()
        .map(|m| {
            m.values()
                .filter(|s| s.on_idle == crate::api::OnIdle::Pause && s.pause_state() == Paused::No)
                .filter(|s| {
                    s.last_used
                        .lock()
                        .is_ok_and(|t| now.saturating_duration_since(*t) >= s.idle_timeout)
                })
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    for s in idle {
        if s.inner.try_lock().is_err() {
            continue;
        }
        tokio::spawn(async move {
            match s.set_paused(Paused::Idle).await {
                Ok(()) => tracing::info!(id = %s.id, "idle session paused"),
                Err(e) => tracing::warn!(id = %s.id, error = %e.message, "pausing an idle session failed"),
            }
        });
    }
}
