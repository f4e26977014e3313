//! What an OCI image's config says about running it, and how airlock merges it into a
//! request. Only the parts that are safe are honoured:
//!
//! - `Env` goes under the request's environment: a variable the request sets wins, and
//!   the image's own (its `PATH` above all) replace airlock's defaults.
//! - `Entrypoint` + `Cmd` give the command only when the request gives none; a request's
//!   command is run as given, never appended to an entrypoint.
//! - `WorkingDir` is where an image's own command starts; a request's command starts in
//!   /workspace, where the request's files are.
//! - `User` is recorded and never applied: the program always runs as the sandbox user.

use crate::spec::{Spec, SpecError};

/// The parts of an image's config (`config` in the OCI image configuration) airlock reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Env`, as `(name, value)` pairs in the image's order.
    pub env: Vec<(String, String)>,
    /// `WorkingDir`, when set (absolute).
    pub working_dir: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `User`, as the image states it (never applied: see the module's documentation).
    pub user: Option<String>,
}

impl ImageConfig {
    /// Parses `Env` entries (`NAME=value`; an entry without `=` is refused, naming it).
    pub fn parse_env(entries: &[String]) -> Result<Vec<(String, String)>, SpecError> {
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| match e.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(SpecError::new(
                    format!("image config Env[{i}]"),
                    format!("{e:?} is not NAME=value"),
                )),
            })
            .collect()
    }

    /// The command an image runs when the request gives none (`Entrypoint` then `Cmd`).
    pub fn default_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(self.cmd.iter()).cloned().collect()
    }
}

impl Spec {
    /// Merges `config` under this request (see the module's documentation). Returns an
    /// error naming `command` when neither the request nor the image gives one.
    pub fn apply_image_config(&mut self, config: &ImageConfig) -> Result<(), SpecError> {
        let mut env: Vec<(String, String)> = config
            .env
            .iter()
            .filter(|(k, _)| !self.env.iter().any(|(rk, _)| rk == k))
            .cloned()
            .collect();
        env.append(&mut self.env);
        self.env = env;
        if self.command.is_empty() {
            self.command = config.default_command();
            if self.command.is_empty() {
                return Err(SpecError::new(
                    "command",
                    "is empty and the image names no Entrypoint or Cmd: give the program to run",
                ));
            }
            // The image's working directory, unless the request named one.
            if self.workdir.is_none() {
                self.workdir = config.working_dir.clone().filter(|d| d.starts_with('/'));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ImageConfig {
        ImageConfig {
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            working_dir: Some("/app".into()),
            entrypoint: vec!["python3".into()],
            cmd: vec!["main.py".into()],
            user: Some("0".into()),
        }
    }

    #[test]
    fn the_request_env_wins_and_the_image_env_comes_first() {
        let mut spec = Spec::new(vec!["env".into()]);
        spec.env = vec![("LANG".into(), "fr_FR.UTF-8".into())];
        spec.apply_image_config(&config()).unwrap();
        assert_eq!(
            spec.env,
            vec![
                ("PATH".to_string(), "/usr/local/bin:/usr/bin".to_string()),
                ("LANG".to_string(), "fr_FR.UTF-8".to_string()),
            ]
        );
        // A request's command runs as given, in /workspace.
        assert_eq!(spec.command, vec!["env".to_string()]);
        assert_eq!(spec.workdir, None);
    }

    #[test]
    fn the_image_command_and_workdir_apply_only_when_the_request_has_no_command() {
        let mut spec = Spec::new(vec![]);
        spec.apply_image_config(&config()).unwrap();
        assert_eq!(spec.command, vec!["python3".to_string(), "main.py".to_string()]);
        assert_eq!(spec.workdir.as_deref(), Some("/app"));
        let mut spec = Spec::new(vec![]);
        let err = spec.apply_image_config(&ImageConfig::default()).unwrap_err();
        assert_eq!(err.field, "command");
    }

    #[test]
    fn env_entries_without_equals_are_refused_by_index() {
        let err = ImageConfig::parse_env(&["A=1".into(), "BROKEN".into()]).unwrap_err();
        assert_eq!(err.field, "image config Env[1]");
        let ok = ImageConfig::parse_env(&["A=b=c".into()]).unwrap();
        assert_eq!(ok, vec![("A".to_string(), "b=c".to_string())]);
    }
}
