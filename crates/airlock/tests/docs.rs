//! The documentation, held to the code (docs/README.md says how):
//!
//! - every ```sh/```bash/```console block of README.md and docs/*.md names, on the line
//!   above it, the test that runs it (`<!-- test: FILE FN -->`), and that test exists and
//!   reads the block's doc; only docs/benchmarks.md may say `<!-- not run: REASON -->`;
//! - every relative link points at a file that exists, and an anchor at a heading (or an
//!   `<a id>`) of it;
//! - docs/api.md is what scripts/gen-api-docs.py makes of the OpenAPI document;
//! - and the blocks that no other suite runs are run here, as typed, against the binary
//!   under test: README.md's set-up and first run, docs/cli.md's `airlock run` examples,
//!   docs/service.md's two blocks, and docs/isolation.md's gVisor and micro-VM blocks.

mod common;
mod serverutil;
mod tierutil;

use common::docs::{doc, doc_block, doc_shell_block, repo_root};
use serverutil::Daemon;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// README.md and every docs/*.md, as paths from the repository's root.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo_root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Each fenced block's opening line: (1-based line number, language, the previous
/// non-blank line).
fn fences(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut open = false;
    let mut prev = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            if !open {
                out.push((i + 1, lang.trim().to_owned(), prev.clone()));
            }
            open = !open;
        }
        if !t.is_empty() {
            prev = t.to_owned();
        }
    }
    assert!(!open, "an unterminated code block");
    out
}

/// Whether `src` defines a test called `name`: a Rust or Python function, or a
/// JavaScript/TypeScript `test("name"`.
fn defines(src: &str, name: &str) -> bool {
    [
        format!("fn {name}("),
        format!("def {name}("),
        format!("test(\"{name}\""),
    ]
    .iter()
    .any(|p| src.contains(p.as_str()))
}

/// The one check of a `<!-- test: FILE FN -->` claim: Err says what is wrong.
fn check_claim(doc_file: &str, claim: &str) -> Result<(), String> {
    let mut parts = claim.split_whitespace();
    let (Some(file), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("`{claim}` is not `FILE FN`"));
    };
    let src = std::fs::read_to_string(repo_root().join(file)).map_err(|e| format!("{file}: {e}"))?;
    if !defines(&src, name) {
        return Err(format!("{file} defines no test {name}"));
    }
    if !src.contains(doc_file) {
        return Err(format!(
            "{file} never names {doc_file}: it cannot be reading the block"
        ));
    }
    Ok(())
}

/// A new example nobody runs fails here: every shell block of the docs names the test that
/// runs it, and that test exists and reads this doc.
#[test]
fn every_shell_block_names_the_test_that_runs_it() {
    let mut problems = Vec::new();
    let mut claimed = 0;
    for file in doc_files() {
        let text = doc(&file);
        for (line, lang, prev) in fences(&text) {
            let claim = prev
                .strip_prefix("<!-- test:")
                .and_then(|s| s.strip_suffix("-->"))
                .map(str::trim);
            if let Some(claim) = claim {
                match check_claim(&file, claim) {
                    Ok(()) => claimed += 1,
                    Err(e) => problems.push(format!("{file}:{line}: {e}")),
                }
                continue;
            }
            if !["sh", "bash", "console", "shell"].contains(&lang.as_str()) {
                continue;
            }
            let not_run = prev.starts_with("<!-- not run:") && prev.ends_with("-->") && prev.len() > 20;
            if not_run && file == "docs/benchmarks.md" {
                // Not run, but not stale either: the scripts it names exist.
                let block = text
                    .lines()
                    .skip(line)
                    .take_while(|l| !l.trim_start().starts_with("```"));
                for word in block
                    .flat_map(str::split_whitespace)
                    .filter(|w| w.starts_with("bench/"))
                {
                    if !repo_root().join(word).exists() {
                        problems.push(format!("{file}:{line}: {word} does not exist"));
                    }
                }
                continue;
            }
            problems.push(format!(
                "{file}:{line}: a ```{lang} block without `<!-- test: FILE FN -->` on the line above \
                 (see docs/README.md){}",
                if not_run {
                    " (`not run` is for docs/benchmarks.md only)"
                } else {
                    ""
                }
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        claimed >= 12,
        "only {claimed} claimed blocks: is the scan broken?"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// made hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a Markdown file offers: its headings' slugs (duplicates numbered as GitHub
/// does) and explicit `<a id="…">`s.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut open = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            open = !open;
            continue;
        }
        if open {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes > 0 && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut s = base.clone();
            let mut n = 0;
            while out.contains(&s) {
                n += 1;
                s = format!("{base}-{n}");
            }
            out.insert(s);
        }
        let mut rest = line;
        while let Some(i) = rest.find("<a id=\"") {
            rest = &rest[i + 7..];
            if let Some(j) = rest.find('"') {
                out.insert(rest[..j].to_owned());
            }
        }
    }
    out
}

/// The Markdown link targets of `text` outside code blocks, inline code and HTML comments.
fn link_targets(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut open = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            open = !open;
            continue;
        }
        if !open {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // HTML comments, then inline code spans, are not links.
    while let Some(i) = prose.find("<!--") {
        let end = prose[i..].find("-->").map_or(prose.len(), |j| i + j + 3);
        prose.replace_range(i..end, "");
    }
    let mut plain = String::new();
    for (i, part) in prose.split('`').enumerate() {
        if i % 2 == 0 {
            plain.push_str(part);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(j) = rest.find(')') {
            out.push(rest[..j].trim().to_owned());
        }
    }
    out
}

/// Every relative link of README.md and docs/*.md leads somewhere: a file of the
/// repository, and a heading or `<a id>` of it for an anchor.
#[test]
fn every_relative_link_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = doc(&file);
        let dir = Path::new(&file).parent().unwrap_or(Path::new("")).to_path_buf();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let rel: PathBuf = if path.is_empty() {
                PathBuf::from(&file)
            } else {
                dir.join(path)
            };
            let full = repo_root().join(&rel);
            checked += 1;
            if !full.exists() {
                problems.push(format!("{file}: ({target}): {} does not exist", rel.display()));
                continue;
            }
            if let Some(a) = anchor {
                let ok = full.extension().is_some_and(|e| e == "md")
                    && anchors(&std::fs::read_to_string(&full).unwrap()).contains(a);
                if !ok {
                    problems.push(format!(
                        "{file}: ({target}): no heading or <a id> #{a} in {}",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 20, "only {checked} links checked: is the scan broken?");
}

/// docs/api.md is what scripts/gen-api-docs.py makes of openapi.json today.
#[test]
fn api_reference_is_generated_from_the_openapi_document() {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/gen-api-docs.py"))
        .arg("--check")
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "docs/api.md is stale: run `python3 scripts/gen-api-docs.py`\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And it is the reference: every route of the document has its section.
    let api = doc("docs/api.md");
    let openapi: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("crates/airlock-server/src/openapi.json")).unwrap(),
    )
    .unwrap();
    for (path, item) in openapi["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys().filter(|m| *m != "parameters") {
            let heading = format!("### {} {path}\n", method.to_uppercase());
            assert!(api.contains(&heading), "docs/api.md lacks {heading:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The blocks run here, as typed.
// ---------------------------------------------------------------------------------------

/// `bash -euo pipefail -c SCRIPT` in `dir`, with the binary under test first on PATH (the
/// docs' `airlock`).
fn bash(script: &str, dir: &Path) -> Output {
    let bin = common::airlock_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn ok(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// README.md's set-up: the build-and-run line (its run half against the binary under
/// test: the build is what `cargo test` just did) and `.ci/run`, the test command, which
/// must be the CI entry point that runs this workspace's tests.
#[test]
fn setup_block_runs() {
    let block = doc_shell_block("README.md", "## Set-up: two commands");
    let lines: Vec<&str> = block
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim())
        .collect();
    assert_eq!(lines.len(), 2, "README.md's set-up changed: {block}");
    let run = lines[0]
        .strip_prefix("cargo build --release && ./target/release/airlock ")
        .unwrap_or_else(|| panic!("README.md's build-and-run line changed: {}", lines[0]));
    assert_eq!(lines[1], ".ci/run", "README.md's test command changed");
    let ci = repo_root().join(".ci/run");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&ci).unwrap().permissions());
    assert!(mode & 0o111 != 0, ".ci/run is not executable");
    let script = std::fs::read_to_string(&ci).unwrap();
    assert!(
        script.contains("cargo test --workspace"),
        ".ci/run does not run the tests"
    );
    let dir = tempfile::tempdir().unwrap();
    let stdout = ok(&bash(&format!("airlock {run}"), dir.path()), lines[0]);
    assert_eq!(stdout, "42\n");
}

/// README.md's first run: 42, then a timeout's result as JSON.
#[test]
fn first_run_block_runs() {
    let block = doc_shell_block("README.md", "## A first run");
    let dir = tempfile::tempdir().unwrap();
    let stdout = ok(&bash(&block, dir.path()), "README.md's first run");
    let (first, json) = stdout.split_once('\n').unwrap();
    assert_eq!(first, "42");
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["outcome"], "timeout", "{v:#}");
    assert_eq!(v["stdout"], "hi\n", "{v:#}");
}

/// docs/cli.md's `airlock run` examples, a `script.py` beside them: 42, an OOM kill as
/// JSON, the script's output.
#[test]
fn cli_run_block_runs() {
    let block = doc_shell_block("docs/cli.md", "## `airlock run");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.py"), "print('from script.py')\n").unwrap();
    let stdout = ok(&bash(&block, dir.path()), "docs/cli.md's block");
    let first = stdout.lines().next().unwrap();
    assert_eq!(first, "42", "{stdout}");
    assert!(stdout.ends_with("from script.py\n"), "{stdout}");
    let json = &stdout[first.len() + 1..stdout.len() - "from script.py\n".len()];
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(v["outcome"], "oom", "{v:#}");
    assert_eq!(v["oom_killed"], true, "{v:#}");
}

/// A block's lines that start a daemon (`… airlock serve [ARGS]`) taken out: the daemon
/// is started by the test on its own port (the rest of the block's `localhost:8710`).
fn without_serve(block: &str) -> (Vec<Vec<String>>, String) {
    let mut serves = Vec::new();
    let mut rest = String::new();
    for line in block.lines() {
        let cmd = line.split("  #").next().unwrap().trim();
        let serve = ["sudo ./target/release/airlock serve", "airlock serve"]
            .iter()
            .find_map(|p| cmd.strip_prefix(p));
        match serve {
            Some(args) => serves.push(args.split_whitespace().map(str::to_owned).collect()),
            None => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    (serves, rest)
}

fn start(args: &[String]) -> Daemon {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start(&args);
    d.wait_ready();
    d
}

/// docs/service.md's first block: the daemon with its defaults, then a one-shot exec.
#[test]
fn service_start_block_runs() {
    let (serves, script) = without_serve(&doc_shell_block("docs/service.md", "## Start it, call it"));
    assert_eq!(
        serves,
        [Vec::<String>::new()],
        "docs/service.md's serve line changed"
    );
    let d = start(&serves[0]);
    let dir = tempfile::tempdir().unwrap();
    let script = script.replace("localhost:8710", &format!("127.0.0.1:{}", d.port));
    let stdout = ok(&bash(&script, dir.path()), "docs/service.md's first block");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(
        (v["outcome"].as_str(), v["stdout"].as_str()),
        (Some("exited"), Some("42\n")),
        "{v:#}"
    );
}

/// docs/service.md's API block: a one-shot with limits and a file, a session's file
/// written, used, read and the session deleted, and a streamed exec.
#[test]
fn service_api_block_runs() {
    let d = start(&[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.csv"), "a,b\n1,2\n3,4\n").unwrap();
    let script = doc_shell_block("docs/service.md", "## API overview")
        .replace("localhost:8710", &format!("127.0.0.1:{}", d.port));
    let stdout = ok(&bash(&script, dir.path()), "docs/service.md's API block");
    // Two JSON results (curl adds no newline), the file read back, then the stream.
    let mut values = serde_json::Deserializer::from_str(&stdout).into_iter::<serde_json::Value>();
    let one_shot = values.next().unwrap().unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(one_shot["stdout"], "2\n", "{one_shot:#}");
    let exec = values.next().unwrap().unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(exec["stdout"], "3 data.csv\n", "{exec:#}");
    let rest = &stdout[values.byte_offset()..];
    assert!(rest.starts_with("a,b\n1,2\n3,4\n"), "the file read back: {rest}");
    for i in 1..=3 {
        assert!(
            stdout.contains(&format!("event: stdout\ndata: {{\"data\":\"{i}\\n\"}}")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("event: result\n"), "{stdout}");
    let all = d.client().get("/v1/sandboxes").expect(200).json();
    assert_eq!(
        all.as_array().map(Vec::len),
        Some(0),
        "the session was deleted: {all:#}"
    );
}

/// A tier's block of docs/isolation.md: its `airlock run` prints 42, its daemon (if any)
/// becomes ready with the block's flags, its `airlock doctor` passes and names the tier.
fn tier_block_runs(tier: &'static str, heading: &str, doctor_says: &str) {
    if tierutil::Tier::selected(tier, &["namespaces", "gvisor", "microvm"]).is_none() {
        return;
    }
    let (serves, script) = without_serve(&doc_shell_block("docs/isolation.md", heading));
    for args in &serves {
        drop(start(args));
    }
    let dir = tempfile::tempdir().unwrap();
    let stdout = ok(&bash(&script, dir.path()), heading);
    assert!(stdout.starts_with("42\n"), "{stdout}");
    assert!(stdout.contains(doctor_says), "{stdout}");
}

/// docs/isolation.md's gVisor block.
#[test]
fn gvisor_block_runs() {
    tier_block_runs("gvisor", "## gVisor isolation", "runsc");
}

/// docs/isolation.md's micro-VM block.
#[test]
fn microvm_block_runs() {
    tier_block_runs("microvm", "## Micro-VM isolation", "VMM");
}

/// The doc helpers find what the tests above rely on: a block under a list item, a
/// block of another language, and a heading's own section only.
#[test]
fn doc_helpers_read_blocks_by_heading() {
    let cidr = doc_shell_block("docs/network.md", "## The policy");
    assert!(cidr.starts_with("airlock run --net proxy --allow-cidr"), "{cidr}");
    let airlockfile = doc_block("docs/images.md", "## Building images", "dockerfile");
    assert!(airlockfile.contains("FROM tools:1"), "{airlockfile}");
    let missing = std::panic::catch_unwind(|| doc_shell_block("docs/network.md", "## The log"));
    assert!(
        missing.is_err(),
        "a section without a shell block must not borrow the next one's"
    );
}
