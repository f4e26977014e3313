//! `update_network`: change a sandbox's network policy while it lives, for its next
//! connections (the REST API's `PATCH /v1/sandboxes/{id}/network`).

use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::create_sandbox::OnDeniedInput;
use super::result::{no_sandbox, refused, structured};
use super::{AirlockMcp, caller};
use crate::service::network;

/// `update_network`'s arguments: each list given replaces the sandbox's.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateNetworkInput {
    /// The sandbox, from create_sandbox (created with a proxy network).
    pub sandbox_id: String,
    /// Host patterns let through from now on, e.g. `["pypi.org", "*.pythonhosted.org"]`.
    pub allow: Option<Vec<String>>,
    /// Private or special address ranges let through on purpose.
    pub allow_cidrs: Option<Vec<String>>,
    /// Hosts or ranges never reached.
    pub deny: Option<Vec<String>>,
    /// `deny` or `ask` for connections the allowlist denies.
    pub on_denied: Option<OnDeniedInput>,
}

/// The sandbox's policy after the change.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct NetworkOutput {
    /// The sandbox.
    pub sandbox_id: String,
    /// Host patterns let through.
    pub allow: Vec<String>,
    /// Address ranges let through on purpose.
    pub allow_cidrs: Vec<String>,
    /// Hosts and ranges never reached.
    pub deny: Vec<String>,
    /// The names of the secrets the proxy puts into requests (their values are never shown).
    pub secrets: Vec<String>,
    /// `deny` or `ask`.
    pub on_denied: String,
}

#[tool_router(router = update_network_router, vis = "pub(super)")]
impl AirlockMcp {
    #[tool(
        name = "update_network",
        description = "Change the network policy of a sandbox from create_sandbox (one created with \
network mode proxy) for its next connections: each list given (allow, allow_cidrs, deny) replaces \
the sandbox's, and on_denied switches between refusing and asking. Connections already open keep \
their decision; the change is recorded in the next exec's egress log.",
        output_schema = schema_for_output::<NetworkOutput>(),
        annotations(
            title = "Change a sandbox's network policy",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn update_network(
        &self,
        Parameters(input): Parameters<UpdateNetworkInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let key = caller(&ctx)?;
        let session = match self.state.session(&input.sandbox_id, &key) {
            Ok(s) => s,
            Err(e) => return Ok(no_sandbox(&e)),
        };
        let patch = airlock_spec::NetworkPatch {
            allow: input.allow,
            allow_cidrs: input.allow_cidrs,
            deny: input.deny,
            on_denied: input.on_denied.map(Into::into),
        };
        match network::update(&session, &patch) {
            Ok(airlock_spec::NetworkPolicy::Proxy(p)) => structured(
                &NetworkOutput {
                    sandbox_id: input.sandbox_id,
                    allow: p.allow,
                    allow_cidrs: p.allow_cidrs,
                    deny: p.deny,
                    secrets: p.secrets.into_iter().map(|s| s.name).collect(),
                    on_denied: match p.on_denied {
                        airlock_spec::OnDenied::Deny => "deny".into(),
                        airlock_spec::OnDenied::Ask => "ask".into(),
                    },
                },
                None,
            ),
            Ok(airlock_spec::NetworkPolicy::None) => Ok(refused(&crate::error::ApiError::invalid(
                "network",
                "this sandbox has no network",
            ))),
            Err(e) => Ok(refused(&e)),
        }
    }
}
