//! "Did you mean": the known name an unknown key, backend key or `PDBMUX_*` variable is most
//! likely a misspelling of.

use super::variables::CONFIG_VAR;
use super::{BACKEND_KEYS, ENV_PREFIX, KEYS};

/// How alike two names must be (normalized Damerau–Levenshtein: one edit in seven is 0.86) for
/// one to be offered as the other's spelling.
const NEAR: f64 = 0.75;

/// The name nearest to `word`, when it is near enough to be a misspelling of it or one of the two
/// is the other cut at a `_` (`tls_ca` for `tls_ca_file`); each candidate is the text compared
/// and the name offered.
fn nearest(
    word: &str,
    candidates: impl Iterator<Item = (&'static str, &'static str)>,
) -> Option<&'static str> {
    candidates
        .map(|(compared, offered)| {
            let cut = |long: &str, short: &str| {
                long.strip_prefix(short)
                    .is_some_and(|rest| rest.starts_with('_'))
            };
            let score = if cut(compared, word) || cut(word, compared) {
                NEAR
            } else {
                strsim::normalized_damerau_levenshtein(word, compared)
            };
            (score, offered)
        })
        .filter(|(score, _)| *score >= NEAR)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, offered)| offered)
}

/// The key `name` (not one of [`KEYS`]) is most likely a misspelling of.
pub(crate) fn nearest_key(name: &str) -> Option<&'static str> {
    nearest(name, KEYS.iter().map(|k| (k.name, k.name)))
}

/// The backend entry key `name` (not one of [`BACKEND_KEYS`]) is most likely a misspelling of.
pub(crate) fn nearest_backend_key(name: &str) -> Option<&'static str> {
    nearest(name, BACKEND_KEYS.iter().map(|k| (*k, *k)))
}

/// The variable an unknown `PDBMUX_*` variable is most likely a misspelling of. Names are
/// compared without the shared prefix, which would make every pair look alike.
pub(crate) fn nearest_var(var: &str) -> Option<&'static str> {
    let stem = var.strip_prefix(ENV_PREFIX).unwrap_or(var);
    let known = KEYS
        .iter()
        .map(|k| k.env.as_str())
        .chain(std::iter::once(CONFIG_VAR));
    nearest(stem, known.map(|env| (&env[ENV_PREFIX.len()..], env)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_key_a_misspelling_is_near() {
        assert_eq!(nearest_key("timout"), Some("timeout"));
        assert_eq!(nearest_key("facts_tll"), Some("facts_ttl"));
        assert_eq!(nearest_key("backend"), Some("backends"));
        assert_eq!(nearest_key("colour"), None);
        assert_eq!(nearest_backend_key("tls_ca"), Some("tls_ca_file"));
        assert_eq!(nearest_backend_key("uri"), None);
    }

    #[test]
    fn suggests_the_variable_a_misspelling_is_near() {
        assert_eq!(nearest_var("PDBMUX_TIMOUT"), Some("PDBMUX_TIMEOUT"));
        assert_eq!(nearest_var("PDBMUX_BACKEND"), Some("PDBMUX_BACKENDS"));
        assert_eq!(nearest_var("PDBMUX_CONFIG_FILE"), Some("PDBMUX_CONFIG"));
        assert_eq!(nearest_var("PDBMUX_CACHE_ENABLED"), None);
    }
}
