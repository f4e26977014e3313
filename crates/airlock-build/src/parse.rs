//! The Airlockfile: a Dockerfile subset, parsed into [`Instruction`]s with line numbers.
//!
//! Lines ending in `\` continue on the next; lines whose first non-blank character is `#`
//! are comments (also inside a continuation); blank lines are skipped. Instructions are
//! case-insensitive. `RUN`, `CMD` and `ENTRYPOINT` take the exec form (a JSON array of
//! strings) or the shell form (`/bin/sh -c` the rest); `COPY` takes `src... dest` or a
//! JSON array. Anything else (`ADD`, `USER`, `LABEL`, `FROM … AS`, `COPY --chown`…) is
//! refused with the line number and the instruction.

use crate::Error;

/// The largest Airlockfile read: real ones are a few KiB; the bound keeps a mistaken path
/// (a log, a binary) from being held in memory and parsed.
pub const MAX_AIRLOCKFILE_BYTES: u64 = 1 << 20;

/// One instruction, as written (variables not yet substituted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// `FROM image` (or `scratch`).
    From(String),
    /// `RUN`: the command (`/bin/sh -c TEXT` for the shell form).
    Run(Vec<String>),
    /// `COPY src... dest`.
    Copy {
        /// Paths in the context.
        sources: Vec<String>,
        /// Where in the image.
        dest: String,
    },
    /// `ENV k=v …` or `ENV k v`.
    Env(Vec<(String, String)>),
    /// `WORKDIR dir`.
    Workdir(String),
    /// `ARG name[=default]`.
    Arg(String, Option<String>),
    /// `CMD`.
    Cmd(Vec<String>),
    /// `ENTRYPOINT`.
    Entrypoint(Vec<String>),
}

/// An instruction and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The line it starts on (1-based).
    pub line: usize,
    /// The instruction's text, continuations joined (for messages and cache keys).
    pub text: String,
    /// What it says.
    pub instruction: Instruction,
}

/// Parses an Airlockfile.
pub fn parse(source: &str) -> Result<Vec<Step>, Error> {
    let mut steps = Vec::new();
    let mut lines = source.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let start = i + 1;
        let mut text = String::new();
        let mut current = line.to_owned();
        loop {
            let t = current.trim_end();
            if let Some(head) = t.strip_suffix('\\') {
                text.push_str(head);
                // The next line that is not a comment continues it.
                match lines.by_ref().find(|(_, l)| !l.trim_start().starts_with('#')) {
                    Some((_, l)) => current = l.to_owned(),
                    None => break,
                }
            } else {
                text.push_str(t);
                break;
            }
        }
        let text = text.trim().to_owned();
        let instruction = parse_instruction(&text).map_err(|reason| Error::Parse { line: start, reason })?;
        steps.push(Step {
            line: start,
            text,
            instruction,
        });
    }
    let first = steps
        .iter()
        .find(|s| !matches!(s.instruction, Instruction::Arg(..)));
    match first {
        Some(s) if matches!(s.instruction, Instruction::From(_)) => {}
        Some(s) => {
            return Err(Error::Parse {
                line: s.line,
                reason: "the first instruction (after ARGs) must be FROM".into(),
            });
        }
        None => {
            return Err(Error::Parse {
                line: 1,
                reason: "no FROM instruction".into(),
            });
        }
    }
    if let Some(s) = steps
        .iter()
        .filter(|s| matches!(s.instruction, Instruction::From(_)))
        .nth(1)
    {
        return Err(Error::Parse {
            line: s.line,
            reason: "a second FROM: multi-stage builds are not supported".into(),
        });
    }
    Ok(steps)
}

fn parse_instruction(text: &str) -> Result<Instruction, String> {
    let (word, rest) = match text.split_once(char::is_whitespace) {
        Some((w, r)) => (w, r.trim()),
        None => (text, ""),
    };
    let keyword = word.to_ascii_uppercase();
    let need = |what: &str| -> Result<(), String> {
        if rest.is_empty() {
            Err(format!("{keyword} needs {what}"))
        } else {
            Ok(())
        }
    };
    Ok(match keyword.as_str() {
        "FROM" => {
            need("an image")?;
            let words = split_words(rest)?;
            if words.len() != 1 {
                return Err("FROM takes one image (FROM … AS and --platform are not supported)".into());
            }
            Instruction::From(words[0].clone())
        }
        "RUN" => {
            need("a command")?;
            Instruction::Run(command(rest)?)
        }
        "CMD" => {
            need("a command")?;
            Instruction::Cmd(command(rest)?)
        }
        "ENTRYPOINT" => {
            need("a command")?;
            Instruction::Entrypoint(command(rest)?)
        }
        "COPY" => {
            need("a source and a destination")?;
            let words = if rest.starts_with('[') {
                json_array(rest)?
            } else {
                split_words(rest)?
            };
            if let Some(flag) = words.iter().find(|w| w.starts_with("--")) {
                return Err(format!(
                    "COPY {flag} is not supported (files are owned by root; there are no other stages)"
                ));
            }
            if words.len() < 2 {
                return Err("COPY needs a source and a destination".into());
            }
            let (dest, sources) = words.split_last().expect("two or more");
            Instruction::Copy {
                sources: sources.to_vec(),
                dest: dest.clone(),
            }
        }
        "ENV" => {
            need("NAME=value")?;
            let words = split_words(rest)?;
            if !words[0].contains('=') {
                // `ENV name value with spaces`
                let (name, value) = rest
                    .split_once(char::is_whitespace)
                    .ok_or_else(|| format!("ENV {rest}: expected NAME=value or NAME value"))?;
                let value = split_words(value.trim())?.join(" ");
                Instruction::Env(vec![(checked_name(name)?, value)])
            } else {
                let mut out = Vec::new();
                for w in words {
                    let (k, v) = w
                        .split_once('=')
                        .ok_or_else(|| format!("ENV {w}: expected NAME=value"))?;
                    out.push((checked_name(k)?, v.to_owned()));
                }
                Instruction::Env(out)
            }
        }
        "WORKDIR" => {
            need("a directory")?;
            let words = split_words(rest)?;
            if words.len() != 1 {
                return Err("WORKDIR takes one directory".into());
            }
            Instruction::Workdir(words[0].clone())
        }
        "ARG" => {
            need("a name")?;
            let words = split_words(rest)?;
            if words.len() != 1 {
                return Err("ARG takes one name[=default]".into());
            }
            match words[0].split_once('=') {
                Some((k, v)) => Instruction::Arg(checked_name(k)?, Some(v.to_owned())),
                None => Instruction::Arg(checked_name(&words[0])?, None),
            }
        }
        other => {
            return Err(format!(
                "unknown or unsupported instruction {other} (supported: FROM, RUN, COPY, ENV, WORKDIR, ARG, CMD, ENTRYPOINT)"
            ));
        }
    })
}

/// A variable name: letters, digits and `_`, not starting with a digit.
fn checked_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(format!("{name:?} is not a variable name"))
    }
}

/// Exec form (a JSON array) or shell form (`/bin/sh -c TEXT`).
fn command(rest: &str) -> Result<Vec<String>, String> {
    if rest.starts_with('[') {
        let words = json_array(rest)?;
        if words.is_empty() {
            return Err("an empty command".into());
        }
        Ok(words)
    } else {
        Ok(vec!["/bin/sh".into(), "-c".into(), rest.to_owned()])
    }
}

fn json_array(rest: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(rest).map_err(|e| format!("not a JSON array of strings: {e}"))
}

/// Splits on blanks, honouring "double" and 'single' quotes and backslash escapes.
pub(crate) fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => cur.push(c),
            (_, '\\') => {
                in_word = true;
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => cur.push('\\'),
                }
            }
            (_, c) => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if quote.is_some() {
        return Err(format!("unterminated quote in {s:?}"));
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Replaces `$NAME` and `${NAME}` by their values (unset: empty); `\$` is a literal `$`.
pub(crate) fn substitute(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'$') {
            out.push('$');
            i += 2;
            continue;
        }
        if b[i] == b'$' {
            if b.get(i + 1) == Some(&b'{')
                && let Some(end) = s[i + 2..].find('}')
            {
                let name = &s[i + 2..i + 2 + end];
                out.push_str(&lookup(name).unwrap_or_default());
                i += end + 3;
                continue;
            }
            let len = s[i + 1..]
                .bytes()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                .count();
            if len > 0 {
                out.push_str(&lookup(&s[i + 1..i + 1 + len]).unwrap_or_default());
                i += len + 1;
                continue;
            }
        }
        let ch = s[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_instruction_with_continuations_and_comments() {
        let steps = parse(
            "ARG BASE=base:1\n# a comment\nFROM $BASE\nRUN echo a \\\n# inside\n  && echo b\n\
             RUN [\"/bin/echo\", \"x\"]\nCOPY a b /dst/\nENV A=1 B=\"two words\"\nENV C three four\n\
             WORKDIR /app\nARG V\ncmd [\"sh\"]\nENTRYPOINT echo hi\n",
        )
        .unwrap();
        assert_eq!(steps[1].instruction, Instruction::From("$BASE".into()));
        assert_eq!(steps[1].line, 3);
        assert_eq!(
            steps[2].instruction,
            Instruction::Run(vec!["/bin/sh".into(), "-c".into(), "echo a   && echo b".into()])
        );
        assert_eq!(
            steps[3].instruction,
            Instruction::Run(vec!["/bin/echo".into(), "x".into()])
        );
        assert_eq!(
            steps[4].instruction,
            Instruction::Copy {
                sources: vec!["a".into(), "b".into()],
                dest: "/dst/".into()
            }
        );
        assert_eq!(
            steps[5].instruction,
            Instruction::Env(vec![("A".into(), "1".into()), ("B".into(), "two words".into())])
        );
        assert_eq!(
            steps[6].instruction,
            Instruction::Env(vec![("C".into(), "three four".into())])
        );
        assert_eq!(steps[8].instruction, Instruction::Arg("V".into(), None));
        assert_eq!(steps[9].instruction, Instruction::Cmd(vec!["sh".into()]));
        assert_eq!(steps[9].line, 13);
    }

    #[test]
    fn refuses_with_the_line() {
        let e = parse("FROM x\n\nADD a b\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("ADD"), "{e}");
        let e = parse("FROM x\nCOPY --chown=1:1 a b\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("--chown"), "{e}");
        assert!(parse("RUN true\n").unwrap_err().to_string().contains("FROM"));
        assert!(
            parse("FROM a\nFROM b\n")
                .unwrap_err()
                .to_string()
                .contains("multi-stage")
        );
        assert!(parse("FROM a AS b\n").is_err());
        assert!(parse("FROM a\nENV 1X=2\n").is_err());
        assert!(parse("FROM a\nRUN [\"unterminated\"\n").is_err());
    }

    #[test]
    fn substitutes_variables() {
        let look = |k: &str| (k == "A").then(|| "x".to_string());
        assert_eq!(substitute("$A/${A}/$B/\\$A/$", &look), "x/x//$A/$");
    }
}
