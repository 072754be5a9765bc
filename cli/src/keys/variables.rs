//! Which `PDBMUX_*` variables pdbmux reads, and which others it leaves alone rather than
//! refusing them as misspellings.

use super::{ENV_PREFIX, KEYS};

/// The variable that names the config file; not a key, since it chooses where keys come from.
pub(super) const CONFIG_VAR: &str = "PDBMUX_CONFIG";

/// The variable `make build` sets for cargo, read at build time (`option_env!` in
/// cli/src/args.rs), never at run time; not refused, so that exporting it for a build does not
/// stop the binary it built.
const BUILD_VERSION_VAR: &str = "PDBMUX_BUILD_VERSION";

/// Whether `var` (set to `value`) is a `PDBMUX_*` variable pdbmux does not read and must refuse
/// (a misspelling, most likely): not a key's variable, not [`CONFIG_VAR`] or
/// [`BUILD_VERSION_VAR`], and not a service link.
pub(crate) fn is_unknown_var(var: &str, value: &str) -> bool {
    var.starts_with(ENV_PREFIX)
        && var != CONFIG_VAR
        && var != BUILD_VERSION_VAR
        && !KEYS.iter().any(|k| k.env == var)
        && !is_service_link(var, value)
}

/// Whether `var=value` is one of the variables Kubernetes sets in every pod for each Service of
/// the namespace (a Service named pdbmux, or pdbmux-anything, makes them `PDBMUX_*`; refusing
/// them would stop every pod from starting): by its name's shape and its value's, so that a
/// misspelling such as `PDBMUX_METRICS_PORT=:9180` is still refused.
///
/// | name | value |
/// |---|---|
/// | `<SVC>_SERVICE_HOST` | an IP address |
/// | `<SVC>_SERVICE_PORT`, `<SVC>_SERVICE_PORT_<NAME>` | a port number |
/// | `<SVC>_PORT`, `<SVC>_PORT_<n>_<TCP\|UDP\|SCTP>` | `tcp://`, `udp://` or `sctp://` address |
/// | `<SVC>_PORT_<n>_<P>_PROTO` | `tcp`, `udp` or `sctp` |
/// | `<SVC>_PORT_<n>_<P>_PORT` | a port number |
/// | `<SVC>_PORT_<n>_<P>_ADDR` | an IP address |
fn is_service_link(var: &str, value: &str) -> bool {
    let port = !value.is_empty() && value.len() <= 5 && value.bytes().all(|b| b.is_ascii_digit());
    let ip = value.parse::<std::net::IpAddr>().is_ok();
    let url = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    if var.ends_with("_SERVICE_HOST") {
        return ip;
    }
    if var.ends_with("_SERVICE_PORT") || var.contains("_SERVICE_PORT_") {
        return port;
    }
    let port_proto = var.match_indices("_PORT_").find_map(|(at, _)| {
        let mut parts = var[at + "_PORT_".len()..].split('_');
        let number = parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let protocol = parts
            .next()
            .is_some_and(|p| matches!(p, "TCP" | "UDP" | "SCTP"));
        let suffix = parts.next();
        (number && protocol && parts.next().is_none()).then_some(suffix)
    });
    match port_proto {
        Some(None) => url,
        Some(Some("PROTO")) => matches!(value, "tcp" | "udp" | "sctp"),
        Some(Some("PORT")) => port,
        Some(Some("ADDR")) => ip,
        Some(Some(_)) => false,
        None => var.ends_with("_PORT") && url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_unknown_variables_but_not_keys_config_or_service_links() {
        for known in [
            "PDBMUX_TIMEOUT",
            "PDBMUX_BACKENDS",
            "PDBMUX_CONFIG",
            "PDBMUX_BUILD_VERSION",
        ] {
            assert!(!is_unknown_var(known, "x"), "{known}");
        }
        for (link, value) in [
            ("PDBMUX_SERVICE_HOST", "10.0.0.7"),
            ("PDBMUX_SERVICE_PORT", "8080"),
            ("PDBMUX_SERVICE_PORT_HTTP", "8080"),
            ("PDBMUX_PORT", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP_PROTO", "tcp"),
            ("PDBMUX_PORT_8080_TCP_PORT", "8080"),
            ("PDBMUX_PORT_8080_TCP_ADDR", "10.0.0.7"),
            ("PDBMUX_METRICS_PORT_9180_TCP_ADDR", "fd00::7"),
            ("PDBMUX_METRICS_SERVICE_HOST", "10.0.0.8"),
        ] {
            assert!(!is_unknown_var(link, value), "{link}={value}");
        }
        for (unknown, value) in [
            ("PDBMUX_TIMOUT", "5s"),
            ("PDBMUX_CACHE_ENABLED", "false"),
            ("PDBMUX_PORT_8080_HTTP", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_X_TCP", "tcp://10.0.0.7:8080"),
            // A link's name with a value no link has: a misspelled setting.
            ("PDBMUX_METRICS_PORT", ":9180"),
            ("PDBMUX_LISTEN_PORT", "8080"),
            ("PDBMUX_SERVICE_HOST", "pdbmux.example.com"),
            ("PDBMUX_SERVICE_PORT", "http"),
            ("PDBMUX_PORT_8080_TCP_PROTO", "http"),
        ] {
            assert!(is_unknown_var(unknown, value), "{unknown}={value}");
        }
        assert!(!is_unknown_var("RUST_LOG", "debug"));
    }
}
