//! `create_sandbox`: a sandbox that keeps its files between execs, until `close_sandbox`
//! or its TTL (the REST API's `POST /v1/sandboxes`).

use airlock_spec::NetworkPolicy;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;

use super::result::{refused, structured};
use super::{AirlockMcp, caller, unless_cancelled};
use crate::api::CreateSandboxRequest;
use crate::config::ServerConfig;
use crate::service::sessions::{create_session, epoch};

/// The sandbox's network.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "mode", rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum NetworkInput {
    /// No network at all (the default).
    None,
    /// Out only through airlock's filtering HTTP(S) proxy, to the hosts listed.
    Proxy {
        /// Host patterns let through, e.g. `pypi.org`, `*.pythonhosted.org`,
        /// `api.example.com:8443` (without a port: 80 and 443).
        #[serde(default)]
        allow: Vec<String>,
        /// Private or special address ranges let through on purpose, e.g. `10.1.2.3/32`.
        #[serde(default)]
        allow_cidrs: Vec<String>,
        /// Hosts (`example.com`, `*.internal.example.com`) or ranges never reached, whatever
        /// allow says.
        #[serde(default)]
        deny: Vec<String>,
        /// `deny` (default): a connection the allowlist denies is refused; `ask`: it is
        /// held while the user is asked (an elicitation during exec) whether to allow it.
        #[serde(default)]
        on_denied: Option<OnDeniedInput>,
        /// Secrets the service holds (its `--secret` flags), by name: the program finds a
        /// placeholder in the variable of that name, which the proxy replaces with the
        /// value only in requests to the secret's hosts. Values are never shown.
        #[serde(default)]
        secrets: Vec<String>,
    },
}

/// What happens to a connection the allowlist denies.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnDeniedInput {
    /// Refused at once.
    Deny,
    /// Held while the user is asked.
    Ask,
}

impl From<OnDeniedInput> for airlock_spec::OnDenied {
    fn from(o: OnDeniedInput) -> Self {
        match o {
            OnDeniedInput::Deny => airlock_spec::OnDenied::Deny,
            OnDeniedInput::Ask => airlock_spec::OnDenied::Ask,
        }
    }
}

/// `create_sandbox`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSandboxInput {
    /// Lifetime in seconds (see the description for the default and the maximum).
    pub ttl_s: Option<NonZeroU64>,
    /// Network: `{"mode": "none"}` (default) or `{"mode": "proxy", "allow": ["pypi.org"]}`.
    pub network: Option<NetworkInput>,
    /// `namespaces` (default) or `microvm`: the sandbox inside a VM of its own.
    pub isolation: Option<super::IsolationInput>,
    /// An image from the service's image store: every exec of the sandbox runs in it
    /// (`python:3.12-slim`); default: the host's system directories.
    pub image: Option<String>,
    /// A snapshot from snapshot_sandbox to start from: the new sandbox has its files
    /// (and its image and isolation).
    pub from_snapshot: Option<String>,
}

/// What `create_sandbox` answers.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CreateSandboxOutput {
    /// Pass it to exec, write_file, read_file and close_sandbox.
    pub sandbox_id: String,
    /// When it is deleted unless closed before, in seconds since the Unix epoch.
    pub expires_at: f64,
    /// Its lifetime in seconds.
    pub ttl_s: u64,
}

/// The tool's description, with this server's lifetimes.
pub(super) fn description(config: &ServerConfig) -> String {
    format!(
        "Create a sandbox for work in several steps: files under /workspace (the working directory) \
and anything installed there persist between exec calls. It lives until close_sandbox or until its \
lifetime passes, then it is deleted with everything in it: ttl_s seconds, default {}, at most {}. No \
network unless network is {{\"mode\": \"proxy\", \"allow\": [hosts]}}. Returns the sandbox_id the \
other tools take.",
        config.default_ttl.as_secs(),
        config.max_ttl.as_secs()
    )
}

#[tool_router(router = create_sandbox_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "create_sandbox",
        // Replaced in `AirlockMcp::new` by `description(config)`.
        description = "Create a sandbox for work in several steps.",
        output_schema = schema_for_output::<CreateSandboxOutput>(),
        annotations(
            title = "Create a sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandbox(
        &self,
        Parameters(input): Parameters<CreateSandboxInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let network = match input.network {
            None => None,
            Some(n) => Some(match n {
                NetworkInput::None => NetworkPolicy::None,
                NetworkInput::Proxy {
                    allow,
                    allow_cidrs,
                    deny,
                    on_denied,
                    secrets,
                } => {
                    let mut held = Vec::with_capacity(secrets.len());
                    for (i, name) in secrets.iter().enumerate() {
                        match self.state.config.secrets.iter().find(|s| s.name == *name) {
                            Some(s) => held.push(s.clone()),
                            None => {
                                let names: Vec<&str> = self
                                    .state
                                    .config
                                    .secrets
                                    .iter()
                                    .map(|s| s.name.as_str())
                                    .collect();
                                return Ok(refused(&crate::error::ApiError::invalid(
                                    format!("network.secrets[{i}]"),
                                    format!(
                                        "the service holds no secret {name:?} (it holds: {})",
                                        if names.is_empty() {
                                            "none".to_owned()
                                        } else {
                                            names.join(", ")
                                        }
                                    ),
                                )));
                            }
                        }
                    }
                    NetworkPolicy::Proxy(airlock_spec::ProxyPolicy {
                        allow,
                        allow_cidrs,
                        deny,
                        on_denied: on_denied.map(Into::into).unwrap_or_default(),
                        secrets: held,
                        ..airlock_spec::ProxyPolicy::default()
                    })
                }
            }),
        };
        let req = CreateSandboxRequest {
            ttl_s: input.ttl_s.map(NonZeroU64::get),
            network,
            isolation: input.isolation.map(Into::into),
            image: input.image,
            from_snapshot: input.from_snapshot,
            ..CreateSandboxRequest::default()
        };
        match unless_cancelled(&ctx, create_session(&self.state, &key, &req)).await? {
            Ok(session) => {
                let ttl = session
                    .expires
                    .duration_since(session.created)
                    .map_or(0, |d| d.as_secs());
                structured(
                    &CreateSandboxOutput {
                        sandbox_id: session.id.clone(),
                        expires_at: epoch(session.expires),
                        ttl_s: ttl,
                    },
                    None,
                )
            }
            Err(e) => Ok(refused(&e)),
        }
    }
}
