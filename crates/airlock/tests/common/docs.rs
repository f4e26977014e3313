//! The repository's documentation as the tests read it: README.md and docs/*.md.
//!
//! Every shell example in those files is run by a test that reads it from here by file
//! and heading (`doc_shell_block("docs/snapshots.md", "# Snapshots")`), so an edit to an
//! example is an edit to what the test runs. `crates/airlock/tests/docs.rs` checks that
//! every ```sh, ```bash and ```console block carries a `<!-- test: FILE FN -->` line
//! naming such a test (see docs/README.md).

use std::path::PathBuf;

/// The workspace root: the directory of README.md and docs/.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The text of a doc file, by its path from the repository's root (`README.md`,
/// `docs/images.md`).
pub fn doc(file: &str) -> String {
    let path = repo_root().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The level of a Markdown heading line (`## x` is 2), outside code blocks only.
fn heading_level(line: &str) -> Option<usize> {
    let hashes = line.chars().take_while(|&c| c == '#').count();
    (hashes > 0 && line[hashes..].starts_with(' ')).then_some(hashes)
}

/// The first fenced block of language `lang` in `file`'s section whose heading line starts
/// with `heading` (`"## Set-up"`, `"# Snapshots"`), before the next heading of that level
/// or above. A fence indented under a list item is found too, its indentation removed from
/// every line. Panics (naming the file and heading) when either is missing: a test whose
/// example moved must fail, not pass on nothing.
pub fn doc_block(file: &str, heading: &str, lang: &str) -> String {
    let text = doc(file);
    let level = heading_level(heading).unwrap_or_else(|| panic!("{heading:?} is not a heading"));
    let mut lines = text.lines();
    let mut in_code = false;
    let found = lines.by_ref().any(|l| {
        if l.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        !in_code && l.starts_with(heading)
    });
    assert!(found, "{file} has no heading {heading:?}");
    let open = format!("```{lang}");
    let mut in_other = false;
    for l in lines.by_ref() {
        let t = l.trim_start();
        if !in_other && t == open {
            let indent = l.len() - t.len();
            let mut body = String::new();
            for b in lines.by_ref() {
                if b.trim_start() == "```" {
                    return body;
                }
                body.push_str(b.get(indent..).unwrap_or(b.trim_start()));
                body.push('\n');
            }
            panic!("{file}'s {heading:?}: unterminated {open} block");
        }
        if t.starts_with("```") {
            in_other = !in_other;
        } else if !in_other && heading_level(l).is_some_and(|n| n <= level) {
            break;
        }
    }
    panic!("{file}'s section {heading:?} has no {open} block")
}

/// [`doc_block`] for a shell (```sh) block: what the doc tests run as typed.
pub fn doc_shell_block(file: &str, heading: &str) -> String {
    doc_block(file, heading, "sh")
}
