//! The password in a URL never reaches a message: whatever characters it holds and however the
//! URL around it is malformed, `redact_userinfo` hides it.

use pdbmux_cli::validate::redact_userinfo;
use proptest::prelude::*;

/// Characters a password may hold, the URL delimiters among them.
const PASSWORD_CHARS: &str = "[a-z0-9/?#@:%!$&'()*+,;=~._\\[\\] -]{0,12}";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_password_is_never_shown(
        scheme in prop::sample::select(vec![
            "http://", "https://", "redis://", "rediss://", "http:/", "http:", "http:///", "://", "",
            "HTTP://", "pdb-a=http://",
        ]),
        user in "[a-z]{0,6}",
        before in PASSWORD_CHARS,
        after in PASSWORD_CHARS,
        host in "[a-z0-9.-]{1,12}",
        rest in prop::sample::select(vec!["", ":8081", ":6379/2", "/", "/x@y", "?a=b", "#f"]),
    ) {
        // The marker's capital letters appear nowhere else in the URL; at both ends and in the
        // middle, so any piece of the password that shows carries one.
        let password = format!("PW{before}PW{after}PW");
        let url = format!("{scheme}{user}:{password}@{host}{rest}");
        let shown = redact_userinfo(&url);
        prop_assert!(!shown.contains("PW"), "{url} shown as {shown}");
        prop_assert!(shown.contains("***@"), "{url} shown as {shown}");
    }

    #[test]
    fn a_url_without_user_info_is_shown_as_it_is(
        scheme in prop::sample::select(vec!["http://", "https://", "redis://", ""]),
        host in "[a-z0-9.-]{1,12}",
        rest in prop::sample::select(vec!["", ":8081", ":6379/2", "/", "?a=b"]),
    ) {
        let url = format!("{scheme}{host}{rest}");
        prop_assert_eq!(redact_userinfo(&url), url);
    }
}
