//! Loading and validation: precedence, file search, env parsing and every validation message.

// `figment::Jail` closures must return `figment::Result`, whose error is large.
#![allow(clippy::result_large_err)]

use std::path::PathBuf;
use std::time::Duration;

use figment::Jail;
use pdbmux_cli::{
    args, load, validate, ConfigFile, Environment, LoadError, LogFormat, SettingFlags, Settings,
    Source,
};
use pdbmux_core::config::{BackendUrl, MergeStrategy, TlsFiles};

/// Global flags parsed exactly as the binary would.
fn flags(list: &[&str]) -> SettingFlags {
    let argv = std::iter::once("pdbmux").chain(list.iter().copied());
    args::parse("pdbmux", argv).expect("flags parse").flags
}

/// A clean environment inside the jail: nothing but HOME (the jail) and what the test sets.
fn clean(jail: &mut Jail) {
    jail.clear_env();
    let home = jail.directory().display().to_string();
    jail.set_env("HOME", home);
}

/// The process environment, with the system config path moved into the jail.
fn env_of(jail: &Jail) -> Environment {
    Environment::from_process().with_system_config(jail.directory().join("etc/pdbmux/config.yaml"))
}

fn settings(jail: &Jail, list: &[&str]) -> Result<Settings, String> {
    let loaded = load(&flags(list), &env_of(jail)).map_err(|e| e.to_string())?;
    validate(&loaded).map_err(|e| e.to_string())
}

/// The validation messages, or a panic if the config validated.
fn problems(jail: &Jail, list: &[&str]) -> Vec<String> {
    let loaded = load(&flags(list), &env_of(jail)).expect("load");
    match validate(&loaded) {
        Ok(s) => panic!("expected validation problems, got {s:?}"),
        Err(e) => e.problems.iter().map(ToString::to_string).collect(),
    }
}

fn write(jail: &Jail, path: &str, contents: &str) -> PathBuf {
    let full = jail.directory().join(path);
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&full, contents).expect("write");
    full
}

const ONE_BACKEND: &str = "pdb-a=http://pdb-a.example.com:8080";

#[test]
fn defaults_with_env_backends() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let s = settings(jail, &[])?;
        let c = &s.config;
        assert_eq!(c.listen, "0.0.0.0:8080");
        assert_eq!(c.merge, MergeStrategy::Freshness);
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.freshness_ttl, Duration::from_secs(30));
        assert_eq!(c.facts_ttl, Duration::from_secs(30));
        assert_eq!(c.facts_cache_bytes, 67_108_864);
        assert_eq!(c.source_fact, "pdbmux_source");
        assert!(c.source_fact_enabled);
        assert!(c.health_probe_enabled);
        assert_eq!(c.health_probe_path, "/status/v1/services");
        assert_eq!(c.health_probe_interval, Duration::from_secs(10));
        assert_eq!(c.health_probe_timeout, Duration::from_secs(5));
        assert_eq!(c.health_probe_failures, 3);
        assert_eq!(c.health_probe_successes, 2);
        assert_eq!(c.max_body_bytes, 536_870_912);
        assert_eq!(c.backends.len(), 1);
        assert_eq!(c.backends[0].name, "pdb-a");
        assert_eq!(
            c.backends[0].url,
            BackendUrl {
                scheme: "http".into(),
                host: "pdb-a.example.com".into(),
                port: Some(8080)
            }
        );
        assert_eq!(c.backends[0].tls, TlsFiles::default());
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.log_level, "info");
        // The whole config equals the core's own defaults apart from the backends.
        assert_eq!(
            *c,
            pdbmux_core::config::Config::with_backends(c.backends.clone())
        );
        Ok(())
    });
}

#[test]
fn precedence_default_file_env_flag() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = write(
            jail,
            "cfg.yaml",
            "listen: 127.0.0.1:9000\nmerge: static\ntimeout: 20s\nfacts_cache_bytes: 4000\n\
             health_probe_enabled: false\nsource_fact: from_file\nlog_format: json\n\
             backends:\n  - name: file-a\n    url: http://file-a.example.com\n",
        );
        let cfg = file.display().to_string();
        let args = ["--config", cfg.as_str()];

        // File over defaults.
        let s = settings(jail, &args)?;
        assert_eq!(s.config.listen, "127.0.0.1:9000");
        assert_eq!(s.config.merge, MergeStrategy::Static);
        assert_eq!(s.config.timeout, Duration::from_secs(20));
        assert_eq!(s.config.facts_cache_bytes, 4000);
        assert!(!s.config.health_probe_enabled);
        assert_eq!(s.config.source_fact, "from_file");
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.config.backends[0].name, "file-a");
        // Keys the file leaves out keep their defaults.
        assert_eq!(s.config.freshness_ttl, Duration::from_secs(30));

        // Env over file.
        jail.set_env("PDBMUX_LISTEN", "127.0.0.1:9100");
        jail.set_env("PDBMUX_MERGE", "freshness");
        jail.set_env("PDBMUX_TIMEOUT", "1m30s");
        jail.set_env("PDBMUX_FACTS_CACHE_BYTES", "2000");
        jail.set_env("PDBMUX_HEALTH_PROBE_ENABLED", "1");
        jail.set_env("PDBMUX_SOURCE_FACT", "from_env");
        jail.set_env("PDBMUX_LOG_FORMAT", "text");
        jail.set_env("PDBMUX_BACKENDS", "env-a=https://env-a.example.com:8081");
        let s = settings(jail, &args)?;
        assert_eq!(s.config.listen, "127.0.0.1:9100");
        assert_eq!(s.config.merge, MergeStrategy::Freshness);
        assert_eq!(s.config.timeout, Duration::from_secs(90));
        assert_eq!(s.config.facts_cache_bytes, 2000);
        assert!(s.config.health_probe_enabled);
        assert_eq!(s.config.source_fact, "from_env");
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.config.backends.len(), 1);
        assert_eq!(s.config.backends[0].name, "env-a");
        assert_eq!(s.config.backends[0].url.scheme, "https");

        // Flags over env.
        let mut with_flags = args.to_vec();
        with_flags.extend([
            "--listen",
            ":9200",
            "--merge",
            "static",
            "--health-probe",
            "false",
            "--log-format",
            "json",
        ]);
        let s = settings(jail, &with_flags)?;
        assert_eq!(s.config.listen, "0.0.0.0:9200");
        assert_eq!(s.config.merge, MergeStrategy::Static);
        assert!(!s.config.health_probe_enabled);
        assert_eq!(s.log_format, LogFormat::Json);
        // Keys without a flag stay with env.
        assert_eq!(s.config.timeout, Duration::from_secs(90));

        // And the sources say so.
        let loaded = load(&flags(&with_flags), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(loaded.source("listen"), Some(&Source::Flag("--listen")));
        assert_eq!(
            loaded.source("health_probe_enabled"),
            Some(&Source::Flag("--health-probe"))
        );
        assert_eq!(
            loaded.source("timeout"),
            Some(&Source::Env("PDBMUX_TIMEOUT"))
        );
        assert_eq!(loaded.source("freshness_ttl"), Some(&Source::Default));
        jail.set_env("PDBMUX_TIMEOUT", "");
        let loaded = load(&flags(&args), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(loaded.source("timeout"), Some(&Source::File(file.clone())));
        Ok(())
    });
}

#[test]
fn file_search_order() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let home_file = jail.directory().join(".config/pdbmux/config.yaml");
        let system = jail.directory().join("etc/pdbmux/config.yaml");

        // Nothing anywhere: fine, and the searched paths are reported.
        let loaded = load(&flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(
            loaded.file(),
            &ConfigFile::NotFound {
                searched: vec![home_file.clone(), system.clone()]
            }
        );

        // The system file when it is the only one.
        write(jail, "etc/pdbmux/config.yaml", "timeout: 3s\n");
        assert_eq!(settings(jail, &[])?.config.timeout, Duration::from_secs(3));

        // $HOME/.config over the system file.
        write(jail, ".config/pdbmux/config.yaml", "timeout: 4s\n");
        let loaded = load(&flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(loaded.file(), &ConfigFile::Found { path: home_file });
        assert_eq!(settings(jail, &[])?.config.timeout, Duration::from_secs(4));

        // $XDG_CONFIG_HOME over $HOME/.config.
        let xdg = jail.directory().join("xdg");
        jail.set_env("XDG_CONFIG_HOME", xdg.display());
        write(jail, "xdg/pdbmux/config.yaml", "timeout: 5s\n");
        assert_eq!(settings(jail, &[])?.config.timeout, Duration::from_secs(5));

        // PDBMUX_CONFIG over the search path; --config over PDBMUX_CONFIG.
        let env_file = write(jail, "env.yaml", "timeout: 6s\n");
        jail.set_env("PDBMUX_CONFIG", env_file.display());
        assert_eq!(settings(jail, &[])?.config.timeout, Duration::from_secs(6));
        let flag_file = write(jail, "flag.yaml", "timeout: 7s\n");
        let flag_path = flag_file.display().to_string();
        assert_eq!(
            settings(jail, &["--config", &flag_path])?.config.timeout,
            Duration::from_secs(7)
        );
        Ok(())
    });
}

#[test]
fn xdg_set_means_home_config_is_not_searched() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        write(jail, ".config/pdbmux/config.yaml", "timeout: 4s\n");
        let xdg = jail.directory().join("xdg");
        jail.set_env("XDG_CONFIG_HOME", xdg.display());
        let loaded = load(&flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(
            loaded.file(),
            &ConfigFile::NotFound {
                searched: vec![
                    xdg.join("pdbmux/config.yaml"),
                    jail.directory().join("etc/pdbmux/config.yaml")
                ]
            }
        );
        assert_eq!(settings(jail, &[])?.config.timeout, Duration::from_secs(10));
        Ok(())
    });
}

#[test]
fn a_named_file_must_exist() {
    Jail::expect_with(|jail| {
        clean(jail);
        let missing = jail.directory().join("nope.yaml");
        let m = missing.display().to_string();
        let err = load(&flags(&["--config", &m]), &env_of(jail)).expect_err("missing --config");
        assert!(matches!(
            err,
            LoadError::Missing {
                via: "--config",
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            format!("config file \"{m}\" not found (given by --config)")
        );

        jail.set_env("PDBMUX_CONFIG", &m);
        let err = load(&flags(&[]), &env_of(jail)).expect_err("missing PDBMUX_CONFIG");
        assert_eq!(
            err.to_string(),
            format!("config file \"{m}\" not found (given by PDBMUX_CONFIG)")
        );
        Ok(())
    });
}

#[test]
fn malformed_file_names_the_file() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = write(jail, "bad.yaml", "listen: [unclosed\n");
        let f = file.display().to_string();
        let err = load(&flags(&["--config", &f]), &env_of(jail)).expect_err("bad yaml");
        assert!(
            err.to_string()
                .starts_with(&format!("config file \"{f}\": ")),
            "{err}"
        );
        // A file of comments only is an empty config, not an error.
        let empty = write(jail, "empty.yaml", "# nothing here\n");
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let e = empty.display().to_string();
        assert_eq!(
            settings(jail, &["--config", &e])?.config.listen,
            "0.0.0.0:8080"
        );
        Ok(())
    });
}

#[test]
fn backends_env_parsing() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env(
            "PDBMUX_BACKENDS",
            "pdb-a=http://pdb-a.example.com:8080, pdb-b=https://[::1]:8081/ ,pdb-c=http://127.0.0.1,",
        );
        let s = settings(jail, &[])?;
        let names: Vec<&str> = s.config.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["pdb-a", "pdb-b", "pdb-c"]);
        assert_eq!(
            s.config.backends[1].url,
            BackendUrl {
                scheme: "https".into(),
                host: "::1".into(),
                port: Some(8081)
            }
        );
        assert_eq!(s.config.backends[1].url.base(), "https://[::1]:8081");
        assert_eq!(s.config.backends[2].url.port, None);
        assert_eq!(s.config.backends[2].url.host, "127.0.0.1");

        // The env list replaces the file's list as a whole.
        let file = write(
            jail,
            "cfg.yaml",
            "backends:\n  - {name: f1, url: 'http://f1.example.com'}\n  - {name: f2, url: 'http://f2.example.com'}\n",
        );
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let f = file.display().to_string();
        let s = settings(jail, &["--config", &f])?;
        assert_eq!(s.config.backends.len(), 1);
        assert_eq!(s.config.backends[0].name, "pdb-a");
        Ok(())
    });
}

#[test]
fn backends_env_bad_entry() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env(
            "PDBMUX_BACKENDS",
            "pdb-a=http://pdb-a.example.com,pdb-b,=http://x.example.com",
        );
        assert_eq!(
            problems(jail, &[]),
            [
                "env PDBMUX_BACKENDS: backends: malformed entry \"pdb-b\" (expected name=url)",
                "env PDBMUX_BACKENDS: backends: malformed entry \"=http://x.example.com\" (expected name=url)",
            ]
        );
        Ok(())
    });
}

#[test]
fn validation_messages() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "PDBMUX_TIMEOUT",
            "ten",
            "timeout: invalid duration \"ten\": expected a number at \"ten\" (e.g. 10s, 500ms, 1m30s)",
        ),
        (
            "PDBMUX_FRESHNESS_TTL",
            "30",
            "freshness_ttl: invalid duration \"30\": missing unit (e.g. 10s, 500ms, 1m30s)",
        ),
        (
            "PDBMUX_HEALTH_PROBE_FAILURES",
            "0",
            "health_probe_failures: must be at least 1, got 0",
        ),
        (
            "PDBMUX_HEALTH_PROBE_SUCCESSES",
            "-2",
            "health_probe_successes: must be at least 1, got -2",
        ),
        (
            "PDBMUX_HEALTH_PROBE_FAILURES",
            "three",
            "health_probe_failures: \"three\" is not a plain integer",
        ),
        (
            "PDBMUX_MERGE",
            "fresh",
            "merge: unknown value \"fresh\" (expected freshness or static)",
        ),
        (
            "PDBMUX_FACTS_CACHE_BYTES",
            "64MiB",
            "facts_cache_bytes: \"64MiB\" is not a plain integer",
        ),
        (
            "PDBMUX_MAX_BODY_BYTES",
            "1.5",
            "max_body_bytes: \"1.5\" is not a plain integer",
        ),
        (
            "PDBMUX_SOURCE_FACT_ENABLED",
            "maybe",
            "source_fact_enabled: \"maybe\" is not true or false",
        ),
        (
            "PDBMUX_LISTEN",
            "8080",
            "listen: \"8080\" is not :port, host:port or [v6]:port",
        ),
        (
            "PDBMUX_LISTEN",
            ":http",
            "listen: \":http\" is not :port, host:port or [v6]:port",
        ),
        (
            "PDBMUX_HEALTH_PROBE_PATH",
            "status",
            "health_probe_path: \"status\" must be a path starting with /",
        ),
        (
            "PDBMUX_LOG_FORMAT",
            "xml",
            "log_format: unknown value \"xml\" (expected text or json)",
        ),
        // Below a floor a timeout fails every request, an interval probes or refreshes in a
        // tight loop (docs/operating.md, "Floors").
        (
            "PDBMUX_TIMEOUT",
            "0s",
            "timeout: \"0s\" is below the floor of 100ms",
        ),
        (
            "PDBMUX_TIMEOUT",
            "99ms",
            "timeout: \"99ms\" is below the floor of 100ms",
        ),
        (
            "PDBMUX_FRESHNESS_TTL",
            "0",
            "freshness_ttl: \"0\" is below the floor of 1s",
        ),
        (
            "PDBMUX_FRESHNESS_TTL",
            "999ms",
            "freshness_ttl: \"999ms\" is below the floor of 1s",
        ),
        (
            "PDBMUX_HEALTH_PROBE_INTERVAL",
            "1ns",
            "health_probe_interval: \"1ns\" is below the floor of 100ms",
        ),
        (
            "PDBMUX_HEALTH_PROBE_INTERVAL",
            "1ms",
            "health_probe_interval: \"1ms\" is below the floor of 100ms",
        ),
        (
            "PDBMUX_HEALTH_PROBE_TIMEOUT",
            "0ms",
            "health_probe_timeout: \"0ms\" is below the floor of 100ms",
        ),
        (
            "PDBMUX_FACTS_TTL",
            "500ms",
            "facts_ttl: \"500ms\" is below the floor of 1s (or 0 to turn the cache off)",
        ),
        (
            "PDBMUX_CONFIG_WATCH_INTERVAL",
            "500ms",
            "config_watch_interval: \"500ms\" is below the floor of 1s (or 0 to turn the watch off)",
        ),
        (
            "PDBMUX_FACTS_CACHE_BYTES",
            "0",
            "facts_cache_bytes: must be at least 1024, got 0",
        ),
        (
            "PDBMUX_MAX_BODY_BYTES",
            "100",
            "max_body_bytes: must be at least 1024, got 100",
        ),
        (
            "PDBMUX_CACHE_MAX_ENTRY_BYTES",
            "1",
            "cache_max_entry_bytes: must be at least 1024, got 1",
        ),
        (
            "PDBMUX_MERGE_REQUEST_BYTES",
            "0",
            "merge_request_bytes: must be at least 1024, got 0",
        ),
        (
            "PDBMUX_MERGE_MEMORY_BYTES",
            "1023",
            "merge_memory_bytes: must be at least 1024, got 1023",
        ),
        // Beyond a year is a mistake, and would overflow a deadline.
        (
            "PDBMUX_CLIENT_SEND_TIMEOUT",
            "300000000000h",
            "client_send_timeout: \"300000000000h\" must be at most a year",
        ),
        (
            "PDBMUX_TIMEOUT",
            "8761h",
            "timeout: \"8761h\" must be at most a year",
        ),
        // Zero would cut every client at once.
        (
            "PDBMUX_CLIENT_HEADER_TIMEOUT",
            "0s",
            "client_header_timeout: \"0s\" is below the floor of 1s",
        ),
        (
            "PDBMUX_CLIENT_SEND_TIMEOUT",
            "500ms",
            "client_send_timeout: \"500ms\" is below the floor of 1s",
        ),
    ];
    for (var, value, want) in cases {
        Jail::expect_with(|jail| {
            clean(jail);
            jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
            jail.set_env(var, value);
            // Each message starts with the variable the value came from.
            assert_eq!(
                problems(jail, &[]),
                [format!("env {var}: {want}")],
                "{var}={value}"
            );
            Ok(())
        });
    }
}

#[test]
fn backend_validation_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "a=http://a.example.com,b=ftp://x",
            "backends[1].url: \"ftp://x\" is not http(s)://host[:port]: scheme \"ftp\" is not http or https",
        ),
        (
            "a=http://a.example.com,a=http://b.example.com",
            "backends: duplicate name \"a\"",
        ),
        (
            "a=http://a.example.com/pdb",
            "backends[0].url: \"http://a.example.com/pdb\" is not http(s)://host[:port]: a path (\"/pdb\") is not allowed; pdbmux appends /pdb/query/v4/... itself",
        ),
        (
            "a=http://user@a.example.com",
            // The user info is not repeated: it may hold a password.
            "backends[0].url: \"http://***@a.example.com\" is not http(s)://host[:port]: user info is not allowed",
        ),
        (
            "a=http://a.example.com?x=1",
            "backends[0].url: \"http://a.example.com?x=1\" is not http(s)://host[:port]: a query is not allowed",
        ),
        (
            "a=a.example.com:8080",
            "backends[0].url: \"a.example.com:8080\" is not http(s)://host[:port]: missing scheme (e.g. http://host:8080)",
        ),
    ];
    for (backends, want) in cases {
        Jail::expect_with(|jail| {
            clean(jail);
            jail.set_env("PDBMUX_BACKENDS", backends);
            let want = format!("env PDBMUX_BACKENDS: {want}");
            assert_eq!(problems(jail, &[]), [want], "{backends}");
            Ok(())
        });
    }
}

#[test]
fn no_backends() {
    Jail::expect_with(|jail| {
        clean(jail);
        assert_eq!(
            problems(jail, &[]),
            ["backends: none configured (set backends in a config file or PDBMUX_BACKENDS=name=url,...)"]
        );
        let file = write(jail, "cfg.yaml", "listen: :8080\nbackends: []\n");
        let f = file.display().to_string();
        assert_eq!(
            problems(jail, &["--config", &f]),
            [format!("{f}:2: backends: none configured (set backends in {f} or PDBMUX_BACKENDS=name=url,...)")]
        );
        Ok(())
    });
}

#[test]
fn file_shape_errors() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = write(
            jail,
            "cfg.yaml",
            "timout: 5s\nbackends:\n  - name: a\n    url: http://a.example.com\n    tls_ca: /x.pem\n  - url: http://b.example.com\n",
        );
        let f = file.display().to_string();
        assert_eq!(
            problems(jail, &["--config", &f]),
            [
                format!("{f}:1: timout: unknown key (did you mean timeout?)"),
                format!("{f}:5: backends[0]: unknown key \"tls_ca\" (did you mean tls_ca_file?)"),
                format!("{f}:6: backends[1].name: missing"),
            ]
        );
        Ok(())
    });
}

#[test]
fn multiple_problems_are_all_reported() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_TIMEOUT", "soon");
        jail.set_env("PDBMUX_HEALTH_PROBE_SUCCESSES", "0");
        let got = problems(jail, &[]);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with("backends: none configured"));
        assert!(got[1].starts_with("env PDBMUX_TIMEOUT: timeout: invalid duration \"soon\""));
        assert_eq!(
            got[2],
            "env PDBMUX_HEALTH_PROBE_SUCCESSES: health_probe_successes: must be at least 1, got 0"
        );
        Ok(())
    });
}

#[test]
fn facts_ttl_clamp_and_zero() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        jail.set_env("PDBMUX_FACTS_TTL", "600s");
        assert_eq!(
            settings(jail, &[])?.config.facts_ttl,
            Duration::from_secs(30)
        );
        jail.set_env("PDBMUX_FACTS_TTL", "0");
        assert_eq!(settings(jail, &[])?.config.facts_ttl, Duration::ZERO);
        jail.set_env("PDBMUX_FACTS_TTL", "1500ms");
        assert_eq!(
            settings(jail, &[])?.config.facts_ttl,
            Duration::from_millis(1500)
        );
        // A YAML integer 0 works too.
        jail.set_env("PDBMUX_FACTS_TTL", "");
        let file = write(jail, "cfg.yaml", "facts_ttl: 0\nfreshness_ttl: 1m30s\n");
        let f = file.display().to_string();
        let s = settings(jail, &["--config", &f])?;
        assert_eq!(s.config.facts_ttl, Duration::ZERO);
        assert_eq!(s.config.freshness_ttl, Duration::from_secs(90));
        Ok(())
    });
}

#[test]
fn go_durations_everywhere() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        jail.set_env("PDBMUX_TIMEOUT", "500ms");
        jail.set_env("PDBMUX_FRESHNESS_TTL", "2h");
        jail.set_env("PDBMUX_HEALTH_PROBE_INTERVAL", "1m30s");
        jail.set_env("PDBMUX_HEALTH_PROBE_TIMEOUT", "1500ms");
        let c = settings(jail, &[])?.config;
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(c.freshness_ttl, Duration::from_secs(7200));
        assert_eq!(c.health_probe_interval, Duration::from_secs(90));
        assert_eq!(c.health_probe_timeout, Duration::from_millis(1500));
        // A YAML number other than 0 has no unit.
        let file = write(jail, "cfg.yaml", "timeout: 10\n");
        jail.set_env("PDBMUX_TIMEOUT", "");
        let f = file.display().to_string();
        assert_eq!(
            problems(jail, &["--config", &f]),
            [format!(
                "{f}:1: timeout: invalid duration \"10\": missing unit (e.g. 10s, 500ms, 1m30s)"
            )]
        );
        Ok(())
    });
}

#[test]
fn booleans_and_integers_from_env_and_file() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        for (value, want) in [
            ("true", true),
            ("false", false),
            ("1", true),
            ("0", false),
            ("no", false),
            ("YES", true),
        ] {
            jail.set_env("PDBMUX_SOURCE_FACT_ENABLED", value);
            assert_eq!(
                settings(jail, &[])?.config.source_fact_enabled,
                want,
                "{value}"
            );
        }
        jail.set_env("PDBMUX_HEALTH_PROBE_FAILURES", "7");
        jail.set_env("PDBMUX_HEALTH_PROBE_SUCCESSES", "1");
        jail.set_env("PDBMUX_MAX_BODY_BYTES", "1048576");
        jail.set_env("PDBMUX_MERGE_REQUEST_BYTES", "2097152");
        jail.set_env("PDBMUX_MERGE_MEMORY_BYTES", "4194304");
        jail.set_env("PDBMUX_STREAM_ABOVE_BYTES", "0");
        let c = settings(jail, &[])?.config;
        assert_eq!((c.health_probe_failures, c.health_probe_successes), (7, 1));
        assert_eq!(c.max_body_bytes, 1_048_576);
        assert_eq!(
            (c.merge_request_bytes, c.merge_memory_bytes),
            (2 << 20, 4 << 20)
        );
        assert_eq!(
            c.stream_above_bytes, 0,
            "every answer that can stream streams"
        );
        Ok(())
    });
}

#[test]
fn listen_forms() {
    for (value, want) in [
        (":8080", "0.0.0.0:8080"),
        ("127.0.0.1:9000", "127.0.0.1:9000"),
        ("localhost:0", "localhost:0"),
        ("[::1]:8080", "[::1]:8080"),
        ("[::]:80", "[::]:80"),
    ] {
        Jail::expect_with(|jail| {
            clean(jail);
            jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
            jail.set_env("PDBMUX_LISTEN", value);
            assert_eq!(settings(jail, &[])?.config.listen, want);
            Ok(())
        });
    }
}

#[test]
fn tls_per_backend_overrides_global() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = write(
            jail,
            "cfg.yaml",
            "tls_ca_file: /etc/pdbmux/ca.pem\ntls_cert_file: /etc/pdbmux/client.pem\ntls_key_file: /etc/pdbmux/client-key.pem\n\
             backends:\n\
             \x20 - name: a\n    url: https://a.example.com:8081\n\
             \x20 - name: b\n    url: https://b.example.com:8081\n    tls_ca_file: /etc/pdbmux/b-ca.pem\n\
             \x20 - name: c\n    url: http://c.example.com:8080\n    tls_cert_file: ''\n    tls_key_file: ''\n",
        );
        let f = file.display().to_string();
        let s = settings(jail, &["--config", &f])?;
        let global = TlsFiles {
            ca_file: Some("/etc/pdbmux/ca.pem".into()),
            cert_file: Some("/etc/pdbmux/client.pem".into()),
            key_file: Some("/etc/pdbmux/client-key.pem".into()),
        };
        assert_eq!(s.config.backends[0].tls, global);
        assert_eq!(
            s.config.backends[1].tls,
            TlsFiles {
                ca_file: Some("/etc/pdbmux/b-ca.pem".into()),
                ..global.clone()
            }
        );
        assert_eq!(
            s.config.backends[2].tls,
            TlsFiles {
                ca_file: Some("/etc/pdbmux/ca.pem".into()),
                cert_file: None,
                key_file: None,
            }
        );

        // Env sets the global ones; env backends inherit them.
        jail.set_env("PDBMUX_BACKENDS", "e=https://e.example.com:8081");
        jail.set_env("PDBMUX_TLS_CA_FILE", "/run/ca.pem");
        let s = settings(jail, &["--config", &f])?;
        assert_eq!(
            s.config.backends[0].tls,
            TlsFiles {
                ca_file: Some("/run/ca.pem".into()),
                ..global
            }
        );
        Ok(())
    });
}

#[test]
fn tls_cert_without_key_is_an_error() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", "a=https://a.example.com");
        jail.set_env("PDBMUX_TLS_CERT_FILE", "/etc/pdbmux/client.pem");
        assert_eq!(
            problems(jail, &[]),
            ["env PDBMUX_BACKENDS: backends[0] (a): tls_cert_file and tls_key_file must be set together"]
        );
        Ok(())
    });
}

#[test]
fn unknown_pdbmux_vars_are_refused_with_the_nearest_name() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        jail.set_env("PDBMUX_TIMOUT", "5s");
        jail.set_env("PDBMUX_CACHE_ENABLED", "false");
        jail.set_env("PDBMUX_CONFIG_FILE", "/etc/pdbmux/config.yaml");
        // Not pdbmux's: other programs' variables are none of its business.
        jail.set_env("TIMEOUT", "5s");
        let loaded = load(&flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(loaded.source("timout"), None, "never read as a key");
        assert_eq!(
            problems(jail, &[]),
            [
                "PDBMUX_CACHE_ENABLED: unknown variable",
                "PDBMUX_CONFIG_FILE: unknown variable (did you mean PDBMUX_CONFIG?)",
                "PDBMUX_TIMOUT: unknown variable (did you mean PDBMUX_TIMEOUT?)",
            ]
        );
        Ok(())
    });
}

#[test]
fn kubernetes_service_links_are_not_refused() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        // What Kubernetes puts in every pod of a namespace holding a Service named pdbmux.
        for (var, value) in [
            ("PDBMUX_SERVICE_HOST", "10.0.0.7"),
            ("PDBMUX_SERVICE_PORT", "8080"),
            ("PDBMUX_SERVICE_PORT_HTTP", "8080"),
            ("PDBMUX_PORT", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP", "tcp://10.0.0.7:8080"),
            ("PDBMUX_PORT_8080_TCP_PROTO", "tcp"),
            ("PDBMUX_PORT_8080_TCP_PORT", "8080"),
            ("PDBMUX_PORT_8080_TCP_ADDR", "10.0.0.7"),
        ] {
            jail.set_env(var, value);
        }
        let s = settings(jail, &[])?;
        assert_eq!(s.config.backends.len(), 1);
        Ok(())
    });
}

#[test]
fn log_level_and_rust_log() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        assert_eq!(settings(jail, &[])?.log_level, "info");
        jail.set_env("RUST_LOG", "pdbmux=debug,warn");
        assert_eq!(settings(jail, &[])?.log_level, "pdbmux=debug,warn");
        // An explicit log_level wins over RUST_LOG.
        jail.set_env("PDBMUX_LOG_LEVEL", "trace");
        assert_eq!(settings(jail, &[])?.log_level, "trace");
        let file = write(jail, "cfg.yaml", "log_level: error\n");
        jail.set_env("PDBMUX_LOG_LEVEL", "");
        let f = file.display().to_string();
        assert_eq!(settings(jail, &["--config", &f])?.log_level, "error");
        // A bad filter names its key.
        jail.set_env("PDBMUX_LOG_LEVEL", "pdbmux=loud");
        let got = problems(jail, &[]);
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with(
                "env PDBMUX_LOG_LEVEL: log_level: invalid log filter \"pdbmux=loud\": "
            ),
            "{got:?}"
        );
        Ok(())
    });
}

#[test]
fn backend_url_parsing() {
    use pdbmux_cli::parse_backend_url;
    let ok = |s: &str| parse_backend_url(s).expect(s);
    assert_eq!(
        ok("HTTP://PDB.Example.COM:80"),
        BackendUrl {
            scheme: "http".into(),
            host: "pdb.example.com".into(),
            port: Some(80)
        }
    );
    assert_eq!(ok("https://pdb.example.com/").port, None);
    assert_eq!(ok("http://[::1]").host, "::1");
    assert!(parse_backend_url("http://pdb.example.com#frag").is_err());
    assert_eq!(
        pdbmux_cli::validate::redact_userinfo("https://user:secret@pdb.example.com:8081/x@y"),
        "https://***@y",
        "an @ after the host hides more than the user info, never less"
    );
    assert_eq!(
        pdbmux_cli::validate::redact_userinfo("pdb-a=http://pdb.example.com"),
        "pdb-a=http://pdb.example.com"
    );
    assert!(parse_backend_url("http://").is_err());
    assert!(parse_backend_url("http:pdb.example.com").is_err());
    assert!(parse_backend_url("http://pdb.example.com:99999").is_err());
}

#[test]
fn metrics_listen_defaults_on_is_turned_off_by_empty_and_checked() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let on = settings(jail, &[]).expect("valid");
        assert_eq!(on.config.metrics_listen.as_deref(), Some("0.0.0.0:9180"));
        jail.set_env("PDBMUX_METRICS_LISTEN", "127.0.0.1:9999");
        let moved = settings(jail, &[]).expect("valid");
        assert_eq!(
            moved.config.metrics_listen.as_deref(),
            Some("127.0.0.1:9999")
        );
        // Empty is a value here (off), where other keys treat an empty env var as unset.
        jail.set_env("PDBMUX_METRICS_LISTEN", "");
        let off = settings(jail, &[]).expect("valid");
        assert_eq!(off.config.metrics_listen, None);
        let file = write(jail, "m.yaml", "metrics_listen: \"\"\n");
        jail.set_env("PDBMUX_METRICS_LISTEN", "9180");
        let bad = problems(jail, &["--config", &file.display().to_string()]);
        assert_eq!(
            bad,
            vec![
                "env PDBMUX_METRICS_LISTEN: metrics_listen: \"9180\" is not :port, host:port or [v6]:port (empty turns it off)"
                    .to_owned()
            ]
        );
        jail.clear_env();
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let from_file = settings(jail, &["--config", &file.display().to_string()]).expect("valid");
        assert_eq!(
            from_file.config.metrics_listen, None,
            "empty in the file: off"
        );
        Ok(())
    });
}

#[test]
fn cache_backend_redis_needs_a_redis_url_and_uses_the_global_tls_files() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", ONE_BACKEND);
        let memory = settings(jail, &[]).expect("valid");
        assert_eq!(
            memory.config.cache_backend,
            pdbmux_core::config::CacheBackend::Memory
        );
        assert_eq!(memory.config.cache_key_prefix, "pdbmux:");
        assert_eq!(memory.config.cache_stale_ttl, Duration::from_secs(300));
        jail.set_env("PDBMUX_CACHE_BACKEND", "redis");
        assert_eq!(
            problems(jail, &[]),
            vec!["cache_redis_url: \"\" is required with cache_backend: redis".to_owned()]
        );
        jail.set_env(
            "PDBMUX_CACHE_REDIS_URL",
            "http://user:secret@127.0.0.1:6379",
        );
        assert_eq!(
            problems(jail, &[]),
            vec![
                "env PDBMUX_CACHE_REDIS_URL: cache_redis_url: \"http://***@127.0.0.1:6379\" is not a redis:// or rediss:// URL"
                    .to_owned()
            ]
        );
        jail.set_env(
            "PDBMUX_CACHE_REDIS_URL",
            "rediss://:secret@127.0.0.1:6380/2",
        );
        jail.set_env("PDBMUX_TLS_CA_FILE", "/etc/pdbmux/ca.pem");
        jail.set_env("PDBMUX_CACHE_STALE_TTL", "2m");
        // A shared store needs the key entries are signed with (docs/caching.md).
        let needed = problems(jail, &[]);
        assert_eq!(needed.len(), 1, "{needed:?}");
        assert!(
            needed[0].starts_with("cache_secret_file: \"\" is required with cache_backend: redis"),
            "{needed:?}"
        );
        jail.set_env("PDBMUX_CACHE_SECRET_FILE", "missing.key");
        let missing = problems(jail, &[]);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0]
                .starts_with("env PDBMUX_CACHE_SECRET_FILE: cache_secret_file: missing.key: "),
            "{missing:?}"
        );
        write(jail, "short.key", "0123456789\n");
        jail.set_env("PDBMUX_CACHE_SECRET_FILE", "short.key");
        let short = problems(jail, &[]);
        assert!(short[0].contains("holds fewer than 16 bytes"), "{short:?}");
        let secret = "5f0c9d0e8a7b6c5d4e3f2a1b0c9d8e7f\n";
        write(jail, "cache.key", secret);
        write(jail, "redis.password", "from-the-file\n");
        jail.set_env("PDBMUX_CACHE_SECRET_FILE", "cache.key");
        jail.set_env("PDBMUX_CACHE_REDIS_PASSWORD_FILE", "redis.password");
        let redis = settings(jail, &[]).expect("valid");
        match redis.config.cache_backend {
            pdbmux_core::config::CacheBackend::Redis {
                url,
                tls,
                secret,
                password,
            } => {
                assert_eq!(url, "rediss://:secret@127.0.0.1:6380/2");
                assert_eq!(tls.ca_file, Some(PathBuf::from("/etc/pdbmux/ca.pem")));
                assert_eq!(secret.expose(), b"5f0c9d0e8a7b6c5d4e3f2a1b0c9d8e7f");
                assert_eq!(password.expect("read").expose(), b"from-the-file");
                assert_eq!(format!("{secret:?}"), "Secret(32 bytes)");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(redis.config.cache_stale_ttl, Duration::from_secs(120));
        let loaded = load(&flags(&[]), &env_of(jail)).expect("load");
        let shown = pdbmux_cli::show(&loaded);
        let line = shown
            .lines
            .iter()
            .find(|l| l.starts_with("cache_redis_url"))
            .expect("shown");
        assert!(line.contains("rediss://***@127.0.0.1:6380/2"), "{line}");
        assert!(!line.contains("secret"), "{line}");
        let key_line = shown
            .lines
            .iter()
            .find(|l| l.starts_with("cache_secret_file"))
            .expect("shown");
        assert!(key_line.contains("cache.key (32 bytes)"), "{key_line}");
        assert!(
            shown
                .lines
                .iter()
                .all(|l| !l.contains("5f0c9d0e") && !l.contains("from-the-file")),
            "{:?}",
            shown.lines
        );
        Ok(())
    });
}

/// A problem names the entry as written: an incomplete entry before it still counts, in the
/// file and in `PDBMUX_BACKENDS`; an unknown key with a dot is found on its own line.
#[test]
fn backend_problems_name_the_entry_as_written() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = write(
            jail,
            "cfg.yaml",
            "backends:\n  - name: a\n  - name: b\n    url: ftp://b.example.com\nlisten.port: 80\n",
        );
        let f = file.display().to_string();
        assert_eq!(
            problems(jail, &["--config", &f]),
            [
                format!("{f}:5: listen.port: unknown key"),
                format!("{f}:2: backends[0].url: missing"),
                format!("{f}:4: backends[1].url: \"ftp://b.example.com\" is not http(s)://host[:port]: scheme \"ftp\" is not http or https"),
            ]
        );
        jail.set_env("PDBMUX_BACKENDS", "broken,b=ftp://b.example.com");
        assert_eq!(
            problems(jail, &[]),
            [
                "env PDBMUX_BACKENDS: backends: malformed entry \"broken\" (expected name=url)",
                "env PDBMUX_BACKENDS: backends[1].url: \"ftp://b.example.com\" is not http(s)://host[:port]: scheme \"ftp\" is not http or https",
            ]
        );
        Ok(())
    });
}
