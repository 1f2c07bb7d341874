//! The model flags `demo` and `acp-agent` share: the deterministic scripted model (the
//! default), or an OpenAI-compatible endpoint.

use std::time::Duration;

use subagents::model::OpenAiConfig;
use subagents::{ErrorCode, SubagentError};

/// Which model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ModelChoice {
    /// The deterministic scripted model (no network).
    Scripted,
    /// An OpenAI-compatible chat-completions endpoint.
    Openai,
}

/// The model flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ModelArgs {
    /// Which model answers: the deterministic scripted model, or an OpenAI-compatible endpoint.
    #[arg(long, value_enum, default_value_t = ModelChoice::Scripted)]
    pub(crate) model: ModelChoice,
    /// The endpoint's base URL (with `--model openai`), e.g. `https://api.openai.com/v1`.
    #[arg(long)]
    pub(crate) base_url: Option<String>,
    /// The model name to request: required with `--model openai`; recorded in the session
    /// with the scripted model.
    #[arg(long)]
    pub(crate) model_name: Option<String>,
    /// The environment variable holding the API key (with `--model openai`); omit it for
    /// endpoints without authentication (a local vLLM or Ollama).
    #[arg(long)]
    pub(crate) api_key_env: Option<String>,
    /// The longest wait to connect to the endpoint, in milliseconds (with `--model openai`)
    /// [default: 10000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) connect_timeout_ms: Option<u64>,
    /// The longest wait for a response to start, in milliseconds (with `--model openai`)
    /// [default: 60000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) request_timeout_ms: Option<u64>,
    /// The longest silence within a streamed response, in milliseconds (with `--model openai`)
    /// [default: 120000].
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) idle_timeout_ms: Option<u64>,
    /// How often a call that waits for the endpoint says so on stderr, in milliseconds (with
    /// `--model openai`; 0: never) [default: 10000].
    #[arg(long, value_name = "MS")]
    pub(crate) wait_notice_ms: Option<u64>,
    /// How often a failed call (a timeout, a 429, a 5xx) is retried (with `--model openai`)
    /// [default: 2].
    #[arg(long, value_name = "N")]
    pub(crate) max_retries: Option<u32>,
}

/// The checked model flags.
pub(crate) enum ModelPlan {
    /// The scripted model.
    Scripted,
    /// An OpenAI-compatible endpoint.
    OpenAi(OpenAiConfig),
}

pub(crate) fn usage(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::InvalidArgs, message)
}

impl ModelArgs {
    /// Checks the flags: the endpoint flags only with `--model openai`, which needs a base URL
    /// and a model name.
    pub(crate) fn plan(&self) -> Result<ModelPlan, SubagentError> {
        match self.model {
            ModelChoice::Scripted => {
                for (given, flag) in [
                    (self.base_url.is_some(), "--base-url"),
                    (self.api_key_env.is_some(), "--api-key-env"),
                    (self.connect_timeout_ms.is_some(), "--connect-timeout-ms"),
                    (self.request_timeout_ms.is_some(), "--request-timeout-ms"),
                    (self.idle_timeout_ms.is_some(), "--idle-timeout-ms"),
                    (self.wait_notice_ms.is_some(), "--wait-notice-ms"),
                    (self.max_retries.is_some(), "--max-retries"),
                ] {
                    if given {
                        return Err(usage(format!("{flag} only applies with --model openai")));
                    }
                }
                Ok(ModelPlan::Scripted)
            }
            ModelChoice::Openai => {
                let base_url = self
                    .base_url
                    .clone()
                    .ok_or_else(|| usage("--model openai needs --base-url"))?;
                let name = self
                    .model_name
                    .clone()
                    .ok_or_else(|| usage("--model openai needs --model-name"))?;
                let mut config = OpenAiConfig::new(base_url, name);
                if let Some(variable) = &self.api_key_env {
                    config = config.api_key_env(variable.clone());
                }
                if let Some(ms) = self.connect_timeout_ms {
                    config = config.connect_timeout(Duration::from_millis(ms));
                }
                if let Some(ms) = self.request_timeout_ms {
                    config = config.request_timeout(Duration::from_millis(ms));
                }
                if let Some(ms) = self.idle_timeout_ms {
                    config = config.idle_timeout(Duration::from_millis(ms));
                }
                if let Some(ms) = self.wait_notice_ms {
                    config = config.wait_notice(Duration::from_millis(ms));
                }
                if let Some(retries) = self.max_retries {
                    config = config.max_retries(retries);
                }
                config.validate()?;
                Ok(ModelPlan::OpenAi(config))
            }
        }
    }
}
