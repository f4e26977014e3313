//! Which gVisor platform (how the Sentry intercepts the program's syscalls) runs on this
//! host, found by trying each with a bounded timeout, fastest first: `systrap` (newer
//! releases only), `kvm` (needs a /dev/kvm that works: under nested virtualization it
//! can hang, which is why every try has a deadline and is killed at it), `ptrace`.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A gVisor platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// seccomp traps in the program's threads (gVisor releases since mid-2023).
    Systrap,
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// ptrace of stub processes: works everywhere, slowest.
    Ptrace,
}

impl Platform {
    /// Its name for `runsc --platform`.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Systrap => "systrap",
            Platform::Kvm => "kvm",
            Platform::Ptrace => "ptrace",
        }
    }

    /// The platform named `name`.
    pub fn from_name(name: &str) -> Option<Platform> {
        match name.trim() {
            "systrap" => Some(Platform::Systrap),
            "kvm" => Some(Platform::Kvm),
            "ptrace" => Some(Platform::Ptrace),
            _ => None,
        }
    }
}

/// How long one platform's try may take: a working platform runs `/bin/true` in a
/// fraction of a second; kvm under a broken nested /dev/kvm never returns.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One platform's try.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The platform tried.
    pub platform: Platform,
    /// `None` when it ran `/bin/true`; else why not.
    pub failure: Option<String>,
    /// How long the try took.
    pub elapsed: Duration,
}

/// What the probe found.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The platform chosen: the first that worked.
    pub platform: Option<Platform>,
    /// Every try made (none when the verdict came from the cache).
    pub trials: Vec<Trial>,
    /// Whether the verdict came from the cache file.
    pub cached: bool,
}

/// `runsc` on `PATH` (or in /usr/bin, /usr/local/bin).
pub fn find_runsc() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

/// `runsc --version`'s first line.
pub fn runsc_version(runsc: &Path) -> io::Result<String> {
    let out = Command::new(runsc).arg("--version").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

/// The platforms this runsc knows (`runsc help platforms`).
fn known_platforms(runsc: &Path) -> Vec<Platform> {
    let out = Command::new(runsc).args(["help", "platforms"]).output();
    let text = out
        .map(|o| {
            let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
            t.push_str(&String::from_utf8_lossy(&o.stderr));
            t
        })
        .unwrap_or_default();
    let mut found: Vec<Platform> = text.lines().filter_map(Platform::from_name).collect();
    if found.is_empty() {
        found.push(Platform::Ptrace);
    }
    found
}

/// Tries the platforms, fastest first; `state` is a scratch directory for runsc's state.
pub fn probe(runsc: &Path, state: &Path) -> Verdict {
    let known = known_platforms(runsc);
    let mut trials = Vec::new();
    for platform in [Platform::Systrap, Platform::Kvm, Platform::Ptrace] {
        if !known.contains(&platform) {
            continue;
        }
        if platform == Platform::Kvm && !Path::new("/dev/kvm").exists() {
            trials.push(Trial {
                platform,
                failure: Some("no /dev/kvm".into()),
                elapsed: Duration::ZERO,
            });
            continue;
        }
        let t0 = Instant::now();
        let failure = try_platform(runsc, state, platform).err();
        trials.push(Trial {
            platform,
            failure: failure.clone(),
            elapsed: t0.elapsed(),
        });
        if failure.is_none() {
            return Verdict {
                platform: Some(platform),
                trials,
                cached: false,
            };
        }
    }
    Verdict {
        platform: None,
        trials,
        cached: false,
    }
}

/// Runs `/bin/true` under `platform` with `runsc do`, killed at [`PROBE_TIMEOUT`].
fn try_platform(runsc: &Path, state: &Path, platform: Platform) -> Result<(), String> {
    let root = state.join(format!("probe-{}-{}", std::process::id(), platform.as_str()));
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut cmd = Command::new(runsc);
    cmd.arg("--root")
        .arg(&root)
        .args(["--network=none", "--ignore-cgroups"])
        .arg(format!("--platform={}", platform.as_str()))
        .args(["do", "/bin/true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group, so a hung try is killed whole (runsc, Sentry, Gofer).
        .process_group(0);
    // SAFETY: the closure only calls prctl, which is async-signal-safe and allocates
    // nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting runsc: {e}"))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let result = loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = io::Read::read_to_string(&mut e, &mut err);
                }
                let last = err.lines().last().unwrap_or("").trim().to_owned();
                break Err(format!("runsc failed ({status}): {last}"));
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                break Err(format!(
                    "did not run /bin/true within {} s (killed)",
                    PROBE_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => break Err(format!("waiting for runsc: {e}")),
        }
    };
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// What the cache file says for this runsc and kernel.
fn cache_key(runsc_version: &str) -> String {
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{runsc_version} / {kernel}")
}

/// The cached verdict in `file`, if it was made for this runsc and kernel.
pub fn cached(file: &Path, runsc_version: &str) -> Option<Platform> {
    let text = std::fs::read_to_string(file).ok()?;
    let (key, platform) = text.trim_end().rsplit_once('\n')?;
    (key == cache_key(runsc_version))
        .then(|| Platform::from_name(platform))
        .flatten()
}

/// Stores a verdict (only a working platform is stored: a host without one is tried
/// again next time).
pub fn store(file: &Path, runsc_version: &str, platform: Platform) -> io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("{}\n{}\n", cache_key(runsc_version), platform.as_str()),
    )?;
    std::fs::rename(tmp, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_verdict_counts_only_for_its_runsc() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("platform");
        assert_eq!(cached(&file, "runsc 1"), None);
        store(&file, "runsc 1", Platform::Ptrace).unwrap();
        assert_eq!(cached(&file, "runsc 1"), Some(Platform::Ptrace));
        assert_eq!(cached(&file, "runsc 2"), None);
    }
}
