//! `airlock image build`: an Airlockfile built into the store from a busybox base image,
//! run with `airlock run --image`, rebuilt from the cache, and refused on bad input. Needs
//! root (the RUN steps are namespace-tier sandboxes), the host's static busybox and
//! python3 (bench/oci_layout.py writes the base image).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn airlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(args)
        .output()
        .expect("run airlock")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A store holding `base:1` (static busybox), a build context, and the store's path.
struct Setup {
    dir: tempfile::TempDir,
    store: String,
}

impl Setup {
    fn new(name: &str) -> Option<Setup> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/bin/busybox").exists() {
            eprintln!("skipped: needs root and /bin/busybox");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("airlock-build-{name}-"))
            .tempdir()
            .unwrap();
        let layout = dir.path().join("layout");
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let st = Command::new("python3")
            .arg(repo.join("bench/oci_layout.py"))
            .arg(&layout)
            .args(["--busybox", "--ref", "base:1"])
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", text(&st.stderr));
        let store = dir.path().join("store").to_str().unwrap().to_owned();
        let out = airlock(&[
            "image",
            "--image-store",
            &store,
            "import",
            layout.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        fs::create_dir_all(dir.path().join("ctx/lib")).unwrap();
        Some(Setup { dir, store })
    }

    fn ctx(&self) -> PathBuf {
        self.dir.path().join("ctx")
    }

    fn write(&self, rel: &str, content: &str) {
        fs::write(self.ctx().join(rel), content).unwrap();
    }

    fn build(&self, tag: &str, extra: &[&str]) -> Output {
        let ctx = self.ctx();
        let mut args = vec![
            "image",
            "--image-store",
            &self.store,
            "build",
            "-t",
            tag,
            "--json",
        ];
        args.extend_from_slice(extra);
        args.push(ctx.to_str().unwrap());
        airlock(&args)
    }

    fn names(&self) -> Vec<String> {
        let out = airlock(&["image", "--image-store", &self.store, "ls", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn built(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "build failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const AIRLOCKFILE: &str = r#"# tools image
ARG BASE=base:1
FROM $BASE
ARG GREETING=hey
COPY hello.txt /app/
COPY lib /app/lib
ENV APPDIR=/app MSG="two words"
WORKDIR /app/work
RUN echo "$GREETING" > made.txt && mkdir -p /usr/local/bin && \
    printf '#!/bin/sh\necho tool ran\n' > /usr/local/bin/tool && chmod 755 /usr/local/bin/tool && \
    echo doomed > /app/doomed
RUN rm /app/doomed /app/hello.txt
CMD ["/bin/sh", "-c", "pwd; cat made.txt; echo \"$APPDIR|$MSG\"; tool; cat /app/lib/a.txt; test -e /app/doomed || echo doomed-gone; test -e /app/hello.txt || echo hello-gone"]
"#;

#[test]
fn build_run_rebuild_from_cache_and_from_a_changed_copy() {
    let Some(s) = Setup::new("ok") else { return };
    s.write("Airlockfile", AIRLOCKFILE);
    s.write("hello.txt", "hello\n");
    s.write("lib/a.txt", "a1\n");

    let first = built(&s.build("tools", &["--build-arg", "GREETING=from-cli"]));
    assert_eq!(first["ran"], 2, "{first}");
    let digest = first["digest"].as_str().unwrap().to_owned();

    let run = airlock(&["run", "--image-store", &s.store, "--image", "tools"]);
    let out = text(&run.stdout);
    assert!(run.status.success(), "{out}{}", text(&run.stderr));
    assert_eq!(
        out,
        "/app/work\nfrom-cli\n/app|two words\ntool ran\na1\ndoomed-gone\nhello-gone\n",
        "stderr: {}",
        text(&run.stderr)
    );

    // Nothing changed: the same digest, every layer step cached, no sandbox started.
    let again = s.build("tools", &["--build-arg", "GREETING=from-cli"]);
    let stderr = text(&again.stderr);
    let again = built(&again);
    assert_eq!(again["digest"], digest.as_str());
    assert_eq!(again["ran"], 0);
    assert_eq!(again["cached"], 5, "{stderr}");
    assert_eq!(stderr.matches("CACHED").count(), 5, "{stderr}");

    // A changed COPY source: the steps before it cached, it and the later ones rebuilt.
    s.write("lib/a.txt", "a2\n");
    let changed = s.build("tools", &["--build-arg", "GREETING=from-cli"]);
    let stderr = text(&changed.stderr);
    let changed = built(&changed);
    assert_ne!(changed["digest"], digest.as_str());
    assert_eq!(changed["cached"], 1, "{stderr}");
    assert_eq!(changed["ran"], 2, "{stderr}");
    assert!(stderr.contains("STEP 4: CACHED"), "{stderr}");
    let run = airlock(&["run", "--image-store", &s.store, "--image", "tools"]);
    assert!(text(&run.stdout).contains("a2\n"), "{}", text(&run.stdout));

    // Another build arg: the RUN that sees it runs again.
    let other = built(&s.build("tools", &["--build-arg", "GREETING=other"]));
    assert_eq!(other["ran"], 2);
}

#[test]
fn bad_input_is_one_line_and_tags_nothing() {
    let Some(s) = Setup::new("bad") else { return };
    s.write("ok.txt", "ok\n");
    std::os::unix::fs::symlink("/etc/passwd", s.ctx().join("escape")).unwrap();
    // What a crashed build left (its lock free) goes at the next build.
    let stale = Path::new(&s.store).join("build-work/build-crashed");
    fs::create_dir_all(stale.join("step/usr")).unwrap();
    fs::write(stale.join(".lock"), "").unwrap();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "FROM base:1\n\nLABEL a=b\n",
            &[],
            "line 3: unknown or unsupported instruction LABEL",
        ),
        (
            "FROM base:1\nCOPY --chown=1:1 ok.txt /x\n",
            &[],
            "line 2: COPY --chown",
        ),
        ("RUN true\n", &[], "must be FROM"),
        (
            "FROM 127.0.0.1:9/nosuch:1\n",
            &["--insecure-registry", "127.0.0.1:9"],
            "image 127.0.0.1:9/nosuch:1",
        ),
        (
            "FROM base:1\nCOPY ../x /x\n",
            &[],
            "../x: outside the build context",
        ),
        (
            "FROM base:1\nCOPY escape /x\n",
            &[],
            "escape: outside the build context",
        ),
        (
            "FROM base:1\nCOPY missing /x\n",
            &[],
            "missing: not found in the build context",
        ),
        (
            "FROM base:1\nRUN echo to-stdout; echo to-stderr >&2; exit 3\n",
            &[],
            "step 2 (line 2: RUN echo to-stdout; echo to-stderr >&2; exit 3) failed: exit code 3",
        ),
        ("FROM base:1\nRUN sleep 30\n", &["--timeout", "1s"], "deadline"),
        (
            "FROM base:1\nRUN i=0; while :; do head -c 1048576 /dev/zero > /f$i; i=$((i+1)); done\n",
            &["--disk", "16M"],
            "wrote more than 16 MiB into the image's tree (--disk)",
        ),
        (
            "FROM base:1\nRUN i=0; while :; do : > /f$i; i=$((i+1)); done\n",
            &["--disk", "16M"],
            "wrote more than 4096 files into the image's tree (--disk)",
        ),
    ];
    for (file, extra, want) in cases {
        s.write("Airlockfile", file);
        let out = s.build("bad", extra);
        let err = text(&out.stderr);
        let last = err.lines().rfind(|l| !l.starts_with("STEP")).unwrap_or("");
        assert!(!out.status.success(), "{file}: {err}");
        assert!(
            last.starts_with("airlock: ") && last.contains(want),
            "{file}: {err}"
        );
        if file.contains("exit 3") {
            assert!(err.contains("to-stdout") && err.contains("to-stderr"), "{err}");
        }
    }
    // Too large.
    s.write("Airlockfile", &"#".repeat(2 << 20));
    let out = s.build("bad", &[]);
    assert!(
        text(&out.stderr).contains("limit for an Airlockfile"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(s.names(), ["docker.io/library/base:1"]);
    // No work tree left behind.
    let work = Path::new(&s.store).join("build-work");
    assert_eq!(fs::read_dir(&work).unwrap().count(), 0);
}

/// docs/images.md's build example ("Building images"), as typed: its Airlockfile written into
/// a context beside a `tool.sh`, its commands run by `sh` in that context, with the base
/// `tools:1` (busybox) imported first and the store in `AIRLOCK_IMAGE_STORE`.
#[test]
fn readme_build_example_runs_as_typed() {
    let Some(setup) = Setup::new("readme") else { return };
    let heading = "## Building images";
    let airlockfile = common::docs::doc_block("docs/images.md", heading, "dockerfile");
    let commands = common::docs::doc_shell_block("docs/images.md", heading);
    let ctx = setup.ctx();
    fs::write(ctx.join("Airlockfile"), &airlockfile).unwrap();
    fs::write(ctx.join("tool.sh"), "#!/bin/sh\necho \"tool $TOOL_VERSION\"\n").unwrap();
    let out = airlock(&[
        "image",
        "--image-store",
        &setup.store,
        "import",
        "--name",
        "tools:1",
    ]);
    assert!(!out.status.success(), "import needs a path");
    let layout = setup.dir.path().join("layout");
    let out = airlock(&[
        "image",
        "--image-store",
        &setup.store,
        "import",
        "--name",
        "tools:1",
        layout.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_airlock"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let digest = || {
        let ls = airlock(&["image", "--image-store", &setup.store, "ls", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "docker.io/library/mytools:latest")
            .map(|i| i["digest"].as_str().unwrap().to_owned())
    };
    let lines: Vec<&str> = commands
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 3, "the README's block changed: {lines:#?}");
    let mut built = None;
    for (i, line) in lines.iter().enumerate() {
        let out = Command::new("sh")
            .arg("-c")
            .arg(line)
            .current_dir(&ctx)
            .env("PATH", &path)
            .env("AIRLOCK_IMAGE_STORE", &setup.store)
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "`{line}`: {stdout}\n{stderr}");
        match i {
            0 => {
                assert_eq!(stderr.matches("/7: ").count(), 7, "{stderr}");
                built = digest();
                assert!(built.is_some(), "mytools tagged: {stderr}");
            }
            1 => assert_eq!(stdout, "tool 2.0\n", "{stderr}"),
            2 => {
                assert!(
                    stderr.contains("CACHED") && stderr.contains(" 0 run,"),
                    "{stderr}"
                );
                assert_eq!(digest(), built, "the same digest");
            }
            _ => unreachable!(),
        }
    }
}
