//! Provides the adapter's configuration ([`OpenAiConfig`]) and the API key it reads.

use super::*;

/// Where and how [`OpenAiAdapter`] calls the provider.
///
/// Built with [`OpenAiConfig::new`] and refined with the chained setters; every duration must
/// be non-zero. [`OpenAiAdapter::new`] validates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    pub(super) base_url: String,
    pub(super) model: String,
    pub(super) api_key_env: Option<String>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) wait_notice: Duration,
    pub(super) max_retries: u32,
    pub(super) backoff_base: Duration,
    pub(super) backoff_cap: Duration,
    pub(super) retry_after_cap: Duration,
}

impl OpenAiConfig {
    /// A configuration for the API under `base_url` (such as `https://api.openai.com/v1`; the
    /// adapter appends `/chat/completions`) calling `model` when a request names none.
    ///
    /// Defaults: no API key; connect timeout 10 s; request timeout (until the response headers)
    /// 60 s; idle timeout (between body reads) 120 s; a notice on the log every 10 s of a wait;
    /// 2 retries; backoff from 500 ms up to 8 s; `Retry-After` honored up to 60 s.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            wait_notice: Duration::from_secs(10),
            max_retries: 2,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(8),
            retry_after_cap: Duration::from_secs(60),
        }
    }

    /// Reads the API key from the environment variable `name` when the adapter is built, and
    /// sends it as a bearer token. Only the variable's name is kept here.
    #[must_use]
    pub fn api_key_env(mut self, name: impl Into<String>) -> Self {
        self.api_key_env = Some(name.into());
        self
    }

    /// The longest wait to establish a connection (default 10 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest wait from sending a request until its response headers arrive (default
    /// 60 s). It does not bound the streamed body; see [`OpenAiConfig::idle_timeout`].
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The longest silence allowed between two reads of the streamed body (default 120 s).
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How often a call that waits for the provider (for its response to start, or for the
    /// next piece of a streamed one) says so on the log, at `WARN`, with how long it has waited
    /// (default 10 s; zero: never): a person watching a slow provider otherwise sees a hang.
    #[must_use]
    pub fn wait_notice(mut self, every: Duration) -> Self {
        self.wait_notice = every;
        self
    }

    /// How many times a retryable failure is retried before it is reported (default 2; `0`
    /// disables retries).
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// The exponential backoff: the first retry waits about `base`, each later one twice as
    /// long, never more than `cap` (defaults 500 ms and 8 s). Jitter keeps each wait between
    /// half and all of that.
    #[must_use]
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap;
        self
    }

    /// The longest provider `Retry-After` the adapter waits for; a longer hint is cut to this
    /// (default 60 s).
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model used when a request names none.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Checks the configuration without touching the environment or the network.
    ///
    /// # Errors
    /// `MODEL_UNAVAILABLE` when the base URL is not an absolute `http`/`https` URL, the model
    /// or the key variable's name is empty, a timeout is zero, or the backoff base exceeds its
    /// cap.
    pub fn validate(&self) -> Result<()> {
        self.endpoint()?;
        if self.model.trim().is_empty() {
            return Err(config_error("the model name is empty"));
        }
        if self
            .api_key_env
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err(config_error("the API key variable's name is empty"));
        }
        for (what, timeout) in [
            ("connect", self.connect_timeout),
            ("request", self.request_timeout),
            ("idle", self.idle_timeout),
        ] {
            if timeout.is_zero() {
                return Err(config_error(format!("the {what} timeout is zero")));
            }
        }
        if self.backoff_base > self.backoff_cap {
            return Err(config_error("the backoff base exceeds the backoff cap"));
        }
        Ok(())
    }

    /// The chat-completions URL under the base URL.
    pub(super) fn endpoint(&self) -> Result<Url> {
        let base = self.base_url.trim().trim_end_matches('/');
        let url = Url::parse(&format!("{base}/chat/completions")).map_err(|error| {
            config_error(format!(
                "the base URL {:?} is invalid: {error}",
                self.base_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(config_error(format!(
                "the base URL {:?} is not an http or https URL",
                self.base_url
            )));
        }
        Ok(url)
    }

    /// The wait before retry number `retry` (from 1): the provider's hint, capped, or else the
    /// jittered backoff.
    pub(super) fn retry_delay(&self, retry: u32, provider_hint_ms: Option<u64>) -> Duration {
        match provider_hint_ms {
            Some(hint) => Duration::from_millis(hint).min(self.retry_after_cap),
            None => self.backoff_delay(retry),
        }
    }

    /// `base * 2^(retry-1)`, capped, then jittered into its upper half.
    pub(super) fn backoff_delay(&self, retry: u32) -> Duration {
        let base = millis(self.backoff_base);
        let cap = millis(self.backoff_cap);
        let ceiling = base
            .saturating_mul(2u64.saturating_pow(retry.saturating_sub(1)))
            .min(cap);
        let floor = ceiling / 2;
        Duration::from_millis(floor.saturating_add(jitter(ceiling - floor, retry)))
    }
}

/// A configuration error.
pub(super) fn config_error(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::ModelUnavailable, message)
}

/// A duration in whole milliseconds, saturating.
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A random number in `0..=max`, from the standard library's randomly keyed hasher.
pub(super) fn jitter(max: u64, salt: u32) -> u64 {
    if max == 0 {
        return 0;
    }
    RandomState::new().hash_one(salt) % max.saturating_add(1)
}

/// The API key read from the environment; prints as `<redacted>`.
pub(super) struct ApiKey(pub(super) String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl ApiKey {
    /// Reads the key from the variable `name`. The value never appears in an error.
    pub(super) fn from_env(name: &str) -> Result<Self> {
        // `VarError`'s own message would quote a non-Unicode value: never print it.
        let value = std::env::var(name).map_err(|error| match error {
            std::env::VarError::NotPresent => {
                config_error(format!("the API key variable {name} is not set"))
            }
            std::env::VarError::NotUnicode(_) => {
                config_error(format!("the API key variable {name} is not valid Unicode"))
            }
        })?;
        let value = value.trim();
        if value.is_empty() {
            return Err(config_error(format!(
                "the API key variable {name} is empty"
            )));
        }
        if !value.chars().all(|c| c.is_ascii_graphic()) {
            return Err(config_error(format!(
                "the API key in {name} holds characters an HTTP header cannot carry"
            )));
        }
        Ok(Self(value.to_owned()))
    }
}
