//! Provides the scrubbed environment an out-of-process child starts with.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

/// The prefixes of a harness's own settings (this runtime's, and the TypeScript harness's): a
/// child runtime (`subagents acp-agent`) must not read its parent's.
const OWN_PREFIXES: [&str; 2] = ["SUBAGENTS_", "DSH_"];

/// Whether `name` looks like a credential: it contains `KEY`, `PASSWORD`, `SECRET` or `TOKEN`,
/// in any case.
pub fn is_credential_name(name: &OsStr) -> bool {
    let upper = name.to_string_lossy().to_ascii_uppercase();
    ["KEY", "PASSWORD", "SECRET", "TOKEN"]
        .iter()
        .any(|word| upper.contains(word))
}

/// The child's environment: `ambient` minus credential-like names and a harness's own `SUBAGENTS_*`
/// and `DSH_*` settings, with `overlay` laid on top. An explicitly configured credential therefore
/// reaches the child while an ambient one never does.
pub fn child_env(
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
    overlay: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = ambient
        .into_iter()
        .filter(|(name, _)| {
            let name_text = name.to_string_lossy();
            !is_credential_name(name)
                && !OWN_PREFIXES
                    .iter()
                    .any(|prefix| name_text.starts_with(prefix))
        })
        .collect();
    env.extend(
        overlay
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value))),
    );
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubs_credentials_and_own_settings_then_overlays() {
        let ambient = [
            ("PATH", "/bin"),
            ("OPENAI_API_KEY", "sk"),
            ("db_password", "pw"),
            ("GH_TOKEN", "t"),
            ("MY_SECRET_THING", "s"),
            ("SUBAGENTS_HELD", "9"),
            ("DSH_PERMISSION_MODE", "auto"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let overlay = BTreeMap::from([
            ("OPENAI_API_KEY".to_owned(), "explicit".to_owned()),
            ("EXTRA".to_owned(), "1".to_owned()),
        ]);
        let env = child_env(ambient, &overlay);
        let names: Vec<_> = env
            .iter()
            .map(|(n, v)| format!("{}={}", n.to_string_lossy(), v.to_string_lossy()))
            .collect();
        assert_eq!(names, ["EXTRA=1", "OPENAI_API_KEY=explicit", "PATH=/bin"]);
    }
}
