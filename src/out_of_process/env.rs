//! Provides the allow-listed environment an out-of-process child starts with.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// The names a child inherits from this process whenever they are set: where it runs, who
/// runs it and how it prints. None of them carries a credential; anything else reaches a child
/// only when its provider names it (`inheritEnv`) or sets it (`env`).
pub const BASE_ENV: [&str; 10] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE",
];

/// The prefix of the locale categories (`LC_ALL`, `LC_CTYPE`, ...), inherited with the base set.
const LOCALE_PREFIX: &str = "LC_";

/// The child's environment, an allow-list: from `ambient`, the [`BASE_ENV`] names, the
/// `LC_*` locale categories and the names in `inherit` (a product's documented ones and the
/// host's own), each when set; then `overlay` laid on top. Nothing else is inherited: not a
/// credential, a connection string, a proxy with a password, an agent socket or a harness's
/// own settings (`SUBAGENTS_*`, `ACP_AGENT_*`), unless the host names or sets it.
pub fn child_env<'a>(
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
    inherit: impl IntoIterator<Item = &'a str>,
    overlay: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let named: Vec<&str> = inherit.into_iter().collect();
    let mut env: BTreeMap<OsString, OsString> = ambient
        .into_iter()
        .filter(|(name, _)| {
            name.to_str().is_some_and(|name| {
                BASE_ENV.contains(&name) || name.starts_with(LOCALE_PREFIX) || named.contains(&name)
            })
        })
        .collect();
    env.extend(
        overlay
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value))),
    );
    env.into_iter().collect()
}

/// Adds `TRACEPARENT`, the OpenTelemetry convention for handing a child process its trace
/// context, for the delegating `span` when a layer records it; a value the host's overlay set
/// stays.
pub(crate) fn with_trace_context(
    mut env: Vec<(OsString, OsString)>,
    span: &tracing::Span,
) -> Vec<(OsString, OsString)> {
    if env.iter().any(|(name, _)| name == "TRACEPARENT") {
        return env;
    }
    if let Some(traceparent) = crate::trace::traceparent_of(span) {
        env.push(("TRACEPARENT".into(), traceparent.into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ambient() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/bin"),
            ("HOME", "/home/u"),
            ("LC_ALL", "C.UTF-8"),
            ("OPENAI_API_KEY", "sk"),
            ("MYSQL_PWD", "pw"),
            ("DATABASE_URL", "postgres://u:pw@db/app"),
            ("HTTPS_PROXY", "http://u:pw@proxy:3128"),
            ("SSH_AUTH_SOCK", "/tmp/agent.sock"),
            ("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=k"),
            ("SENTRY_DSN", "https://k@sentry/1"),
            ("REDIS_URL", "redis://:pw@cache:6379"),
            ("MONGODB_URI", "mongodb://u:pw@mongo/app"),
            ("SMTP_PASS", "pw"),
            ("BACKUP_PWD", "pw"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/home/u/key.json"),
            ("HTTP_PROXY", "http://u:pw@proxy:3128"),
            ("ALL_PROXY", "socks5://u:pw@proxy:1080"),
            ("DSH_PERMISSION_MODE", "auto"),
            ("SUBAGENTS_HELD", "9"),
            ("ACP_AGENT_TEXT", "scripted"),
            ("CODEX_HOME", "/home/u/.codex"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)))
        .to_vec()
    }

    fn printed(env: &[(OsString, OsString)]) -> Vec<String> {
        env.iter()
            .map(|(n, v)| format!("{}={}", n.to_string_lossy(), v.to_string_lossy()))
            .collect()
    }

    #[test]
    fn only_the_base_set_is_inherited_and_the_overlay_is_laid_on_top() {
        let overlay = BTreeMap::from([
            ("OPENAI_API_KEY".to_owned(), "explicit".to_owned()),
            ("ACP_AGENT_TEXT".to_owned(), "configured".to_owned()),
        ]);
        assert_eq!(
            printed(&child_env(ambient(), [], &overlay)),
            [
                "ACP_AGENT_TEXT=configured",
                "HOME=/home/u",
                "LC_ALL=C.UTF-8",
                "OPENAI_API_KEY=explicit",
                "PATH=/bin",
            ]
        );
    }

    #[test]
    fn a_named_variable_is_inherited_when_set() {
        let env = child_env(
            ambient(),
            ["CODEX_HOME", "HTTPS_PROXY", "NOT_SET"],
            &BTreeMap::new(),
        );
        assert_eq!(
            printed(&env),
            [
                "CODEX_HOME=/home/u/.codex",
                "HOME=/home/u",
                "HTTPS_PROXY=http://u:pw@proxy:3128",
                "LC_ALL=C.UTF-8",
                "PATH=/bin",
            ]
        );
    }

    // Issue #19: a product child is handed its delegating span's trace context, the way
    // OpenTelemetry hands one to a child process, and a value the host set stays.
    #[test]
    fn a_recorded_delegating_span_hands_the_child_its_traceparent() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("delegation");
            let env = with_trace_context(Vec::new(), &span);
            let traceparent = crate::trace::traceparent_of(&span).unwrap();
            assert_eq!(env, [("TRACEPARENT".into(), traceparent.clone().into())]);
            assert!(
                traceparent.starts_with("00-") && traceparent.len() == 55,
                "{traceparent}"
            );
            let set = vec![("TRACEPARENT".into(), "00-host".into())];
            assert_eq!(with_trace_context(set.clone(), &span), set);
        });
        // Nothing records spans here: nothing is added.
        assert!(with_trace_context(Vec::new(), &tracing::info_span!("unrecorded")).is_empty());
    }
}
