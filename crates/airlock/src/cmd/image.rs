//! `airlock image pull | import | ls | rm | prune`: the image store from the command line,
//! and the store options `run` and `serve` share.

use airlock_image::{Credentials, Image, PullOptions, Store, StoreOptions};
use airlock_spec::{format_size, human_size, parse_duration, parse_size};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Where the image store is and how much disk it may take (shared by `image`, `run` and
/// `serve`).
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The image store's directory (blobs, unpacked layers, prepared roots, records).
    #[arg(long, value_name = "DIR", env = "AIRLOCK_IMAGE_STORE", default_value = airlock_image::DEFAULT_ROOT, global = true)]
    pub image_store: PathBuf,
    /// The most disk the store's blobs and unpacked layers may take (10G; default: no
    /// limit). A pull or import that would pass it is refused and leaves nothing behind.
    #[arg(long, value_name = "SIZE", value_parser = size, global = true)]
    pub image_store_max: Option<u64>,
}

/// Where the service keeps snapshots (`serve` and `mcp`).
#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    /// The snapshot store's directory: snapshots outlive the daemon there. One daemon
    /// uses it at a time; another finds snapshots unavailable (503) and says why.
    #[arg(long, value_name = "DIR", env = "AIRLOCK_SNAPSHOT_DIR", default_value = airlock_server::config::DEFAULT_SNAPSHOT_DIR)]
    pub snapshot_dir: PathBuf,
    /// The most disk snapshots may take; a snapshot that would pass it is refused (507).
    #[arg(long, value_name = "SIZE", default_value = "10G", value_parser = size)]
    pub snapshot_budget: u64,
    /// The most sandboxes one fork request may make.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_fork: usize,
}

impl SnapshotArgs {
    /// Puts these settings into `c`.
    pub fn apply(&self, c: &mut airlock_server::ServerConfig) -> anyhow::Result<()> {
        if self.max_fork == 0 {
            anyhow::bail!("--max-fork must be at least 1");
        }
        c.snapshot_dir = Some(self.snapshot_dir.clone());
        c.snapshot_budget = self.snapshot_budget;
        c.max_fork = self.max_fork;
        Ok(())
    }
}

impl StoreArgs {
    /// Opens (creating if needed) the store.
    pub fn open(&self) -> anyhow::Result<Store> {
        Store::open(
            &self.image_store,
            StoreOptions {
                max_bytes: self.image_store_max,
                ..StoreOptions::default()
            },
        )
        .with_context(|| format!("--image-store {}", self.image_store.display()))
    }
}

/// How to reach registries (shared by `image pull` and `run --image`).
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// A registry (`host[:port]`) reached over plain HTTP instead of HTTPS; repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure: Vec<String>,
    /// The longest a pull may take (10m, 90s).
    #[arg(long = "pull-timeout", value_name = "DURATION", default_value = "10m", value_parser = duration)]
    pub pull_timeout: Duration,
    /// A user name for the registry (with the password on stdin: --password-stdin);
    /// default: the docker config file's credentials ($DOCKER_CONFIG/config.json or
    /// ~/.docker/config.json), else none.
    #[arg(long, value_name = "USER", requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password from stdin (with --username).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
}

impl RegistryArgs {
    /// The pull options these flags give (reads the password from stdin when asked).
    pub fn options(&self) -> anyhow::Result<PullOptions> {
        let credentials = match &self.username {
            Some(username) => {
                let mut password = String::new();
                std::io::stdin()
                    .take(64 << 10)
                    .read_to_string(&mut password)
                    .context("--password-stdin: reading stdin")?;
                Credentials::Basic {
                    username: username.clone(),
                    password: password.trim_end_matches(['\r', '\n']).to_owned(),
                }
            }
            None => Credentials::DockerConfig(None),
        };
        Ok(PullOptions {
            insecure: self.insecure.clone(),
            credentials,
            timeout: self.pull_timeout,
            ..PullOptions::default()
        })
    }
}

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Pull an image from a registry (`python:3.12-slim` is Docker Hub's
    /// `docker.io/library/python:3.12-slim`) for linux/amd64.
    Pull {
        /// The image reference (`[registry/]repository[:tag|@sha256:…]`).
        reference: String,
        #[command(flatten)]
        registry: RegistryArgs,
        /// Print what was stored as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import a `docker save` archive or an OCI image layout (a directory or a tar).
    Import {
        /// The archive or layout.
        path: PathBuf,
        /// The name to record it under (default: the names the archive carries).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Print what was stored as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the images in the store.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove images by name or digest, and whatever no other image still needs.
    Rm {
        /// Names or digests.
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Remove every blob, layer and root no image needs, and work a crashed airlock left.
    Prune,
    /// Build an image from an Airlockfile (FROM/RUN/COPY/ENV/WORKDIR/ARG/CMD/ENTRYPOINT),
    /// each RUN in a sandbox, each layer cached.
    Build(super::build::BuildArgs),
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.reason.to_string())
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.reason.to_string())
}

/// One image as `ls --json` and `pull --json` print it.
fn image_json(image: &Image) -> serde_json::Value {
    serde_json::json!({
        "name": image.name,
        "digest": image.manifest_digest.to_string(),
        "config_digest": image.config_digest.to_string(),
        "layers": image.layers.len(),
        "size_bytes": image.size,
        "created": image.created,
        "env": image.config.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "entrypoint": image.config.entrypoint,
        "cmd": image.config.cmd,
        "working_dir": image.config.working_dir,
    })
}

/// Pulls `reference` into `store` and records it under its canonical name; says what it
/// did on stderr unless `quiet`.
pub fn pull(store: &Store, reference: &str, options: &PullOptions, quiet: bool) -> anyhow::Result<Image> {
    let start = Instant::now();
    let pulled = match airlock_image::pull(store, reference, options) {
        Ok(pulled) => pulled,
        Err(e) => {
            if let airlock_image::Error::InsecureRefused { registry, .. } = &e {
                bail!("{e}; to use plain HTTP with it, give --insecure-registry {registry}")
            }
            return Err(e.into());
        }
    };
    let image = store.tag(&pulled.reference, &pulled.manifest_digest)?;
    if !quiet {
        eprintln!(
            "airlock: pulled {} ({}, {} layers, {} fetched in {:.1} s)",
            image.name,
            short(&image),
            image.layers.len(),
            human_size(pulled.bytes_fetched),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(image)
}

/// The first 12 hex digits of an image's manifest digest.
fn short(image: &Image) -> String {
    format!("sha256:{}", &image.manifest_digest.hex()[..12])
}

pub fn run(args: ImageArgs) -> anyhow::Result<ExitCode> {
    let store = args.store.open()?;
    match args.command {
        ImageCommand::Pull {
            reference,
            registry,
            json,
        } => {
            let image = pull(&store, &reference, &registry.options()?, json)?;
            if json {
                println!("{}", image_json(&image));
            }
        }
        ImageCommand::Import { path, name, json } => {
            let images = store
                .import(&path, name.as_deref())
                .with_context(|| format!("import {}", path.display()))?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(images.iter().map(image_json).collect())
                );
            } else {
                for image in &images {
                    eprintln!(
                        "airlock: imported {} ({}, {} layers, {})",
                        image.name,
                        short(image),
                        image.layers.len(),
                        human_size(image.size)
                    );
                }
            }
        }
        ImageCommand::Ls { json } => {
            let images = store.images()?;
            if json {
                println!(
                    "{}",
                    serde_json::Value::Array(images.iter().map(image_json).collect())
                );
            } else {
                println!("{:<60} {:<20} {:>7} {:>10}", "NAME", "DIGEST", "LAYERS", "SIZE");
                for image in &images {
                    println!(
                        "{:<60} {:<20} {:>7} {:>10}",
                        image.name,
                        short(image),
                        image.layers.len(),
                        human_size(image.size)
                    );
                }
            }
        }
        ImageCommand::Rm { images } => {
            for name in &images {
                let image = airlock_image::resolve(&store, name)?;
                let freed = store.remove_image(&image.name)?;
                eprintln!("airlock: removed {} (freed {})", image.name, human_size(freed));
                // Its micro-VM block image goes with its last name.
                let digest = image.manifest_digest.to_string();
                if !store
                    .images()?
                    .iter()
                    .any(|i| i.manifest_digest == image.manifest_digest)
                {
                    remove_vm_drive(&digest)?;
                }
            }
        }
        ImageCommand::Build(build) => return super::build::run(&store, build),
        ImageCommand::Prune => {
            let report = store.prune_images()?;
            eprintln!(
                "airlock: pruned {} blobs and {} layers (freed {})",
                report.blobs.len(),
                report.layers.len(),
                format_size(report.freed_bytes)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes the micro-VM tier's block image of the image `digest` (built from its
/// prepared root in the VM cache), if there is one.
fn remove_vm_drive(digest: &str) -> anyhow::Result<()> {
    let cache = airlock_microvm::HostOptions::from_env().cache;
    let (n, bytes) = airlock_microvm::image::remove_image_drives(&cache, &[digest.to_owned()])
        .with_context(|| format!("removing the micro-VM image drive in {}", cache.display()))?;
    if n > 0 {
        eprintln!(
            "airlock: removed its micro-VM image drive (freed {})",
            human_size(bytes)
        );
    }
    Ok(())
}

/// `run --image`: the image, pulled first when it is not in the store and `pull` allows.
pub fn for_run(
    store: &Store,
    reference: &str,
    pull_policy: &str,
    registry: &RegistryArgs,
) -> anyhow::Result<Image> {
    if pull_policy == "always" {
        return pull(store, reference, &registry.options()?, false);
    }
    match airlock_image::resolve(store, reference) {
        Ok(image) => Ok(image),
        Err(airlock_image::Error::ImageNotFound(_)) if pull_policy == "missing" => {
            pull(store, reference, &registry.options()?, false)
        }
        Err(e) => bail!("--image {reference}: {e}"),
    }
}
