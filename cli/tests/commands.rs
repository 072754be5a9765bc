//! The commands: `config init`, `config show`, `version`, `--help` and the serve path of `run`.

// `figment::Jail` closures must return `figment::Result`, whose error is large.
#![allow(clippy::result_large_err)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use figment::Jail;
use pdbmux_cli::{
    args, init, key_names, load, run_with, show, template, validate, Command, ConfigCommand,
    Environment, InitError, InitFlags, LogFormat, SettingFlags, Settings,
};

fn flags(list: &[&str]) -> SettingFlags {
    let argv = std::iter::once("pdbmux").chain(list.iter().copied());
    args::parse("pdbmux", argv).expect("flags parse").flags
}

/// `config init`'s flags parsed exactly as the binary would.
fn init_flags(list: &[&str]) -> InitFlags {
    let argv = ["pdbmux", "config", "init"]
        .into_iter()
        .chain(list.iter().copied());
    match args::parse("pdbmux", argv)
        .expect("flags parse")
        .into_command()
    {
        Command::Config {
            command: ConfigCommand::Init(flags),
        } => flags,
        other => panic!("not config init: {other:?}"),
    }
}

fn clean(jail: &mut Jail) {
    jail.clear_env();
    let home = jail.directory().display().to_string();
    jail.set_env("HOME", home);
}

fn env_of(jail: &Jail) -> Environment {
    Environment::from_process().with_system_config(jail.directory().join("etc/pdbmux/config.yaml"))
}

/// Runs the CLI in-process; returns (exit code, stdout, stderr, settings handed to serve).
fn run(env: &Environment, argv: &[&str]) -> (u8, String, String, Option<Settings>) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let seen = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&seen);
    let code = run_with(
        "pdbmux",
        std::iter::once("pdbmux").chain(argv.iter().copied()),
        env,
        &mut out,
        &mut err,
        move |settings, _reloader| {
            *keep.lock().expect("lock") = Some(settings);
            Ok(())
        },
    );
    let settings = seen.lock().expect("lock").take();
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        settings,
    )
}

#[test]
fn init_writes_refuses_and_forces() {
    Jail::expect_with(|jail| {
        clean(jail);
        let xdg = jail.directory().join("xdg");
        jail.set_env("XDG_CONFIG_HOME", xdg.display());
        let want = xdg.join("pdbmux/config.yaml");

        let (code, out, err, _) = run(&env_of(jail), &["config", "init"]);
        assert_eq!((code, err.as_str()), (0, ""));
        assert_eq!(out, format!("wrote {}\n", want.display()));
        assert_eq!(std::fs::read_to_string(&want).expect("read"), template());

        // Refuses to overwrite.
        std::fs::write(&want, "# mine\n").expect("write");
        let (code, out, err, _) = run(&env_of(jail), &["config", "init"]);
        assert_eq!(code, 1);
        assert_eq!(out, "");
        assert_eq!(
            err,
            format!(
                "pdbmux: \"{}\" already exists (use --force to overwrite)\n",
                want.display()
            )
        );
        assert_eq!(std::fs::read_to_string(&want).expect("read"), "# mine\n");

        // --force overwrites.
        let (code, _, _, _) = run(&env_of(jail), &["config", "init", "--force"]);
        assert_eq!(code, 0);
        assert_eq!(std::fs::read_to_string(&want).expect("read"), template());
        Ok(())
    });
}

#[test]
fn init_target_order() {
    Jail::expect_with(|jail| {
        clean(jail);
        // No XDG: $HOME/.config.
        let path = init(&init_flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(path, jail.directory().join(".config/pdbmux/config.yaml"));

        // PDBMUX_CONFIG over the default, creating parent directories.
        let env_path = jail.directory().join("a/b/env.yaml");
        jail.set_env("PDBMUX_CONFIG", env_path.display());
        let path = init(&init_flags(&[]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(path, env_path);
        assert!(env_path.is_file());

        // --config over PDBMUX_CONFIG.
        let flag_path = jail.directory().join("c/flag.yaml");
        let f = flag_path.display().to_string();
        let path =
            init(&init_flags(&["--config", &f]), &env_of(jail)).map_err(|e| e.to_string())?;
        assert_eq!(path, flag_path);

        // Nowhere to write.
        jail.clear_env();
        let err =
            init(&init_flags(&[]), &Environment::from_pairs([("A", "b")])).expect_err("no path");
        assert!(matches!(err, InitError::NoPath));
        Ok(())
    });
}

#[test]
fn init_file_loads_back_with_defaults() {
    Jail::expect_with(|jail| {
        clean(jail);
        let path: PathBuf = jail.directory().join("pdbmux.yaml");
        let p = path.display().to_string();
        init(&init_flags(&["--config", &p]), &env_of(jail)).map_err(|e| e.to_string())?;

        // Without backends it loads but does not validate, and says why.
        let loaded = load(&flags(&["--config", &p]), &env_of(jail)).map_err(|e| e.to_string())?;
        let err = validate(&loaded).expect_err("no backends");
        assert_eq!(err.problems.len(), 1, "{err}");
        // It names the file to add them to (what a newcomer after `config init` needs).
        assert_eq!(
            err.to_string(),
            format!(
                "backends: none configured (set backends in {p} or PDBMUX_BACKENDS=name=url,...)"
            )
        );

        // With backends from the env every value is the default.
        jail.set_env("PDBMUX_BACKENDS", "pdb-a=http://pdb-a.example.com:8080");
        let loaded = load(&flags(&["--config", &p]), &env_of(jail)).map_err(|e| e.to_string())?;
        let s = validate(&loaded).map_err(|e| e.to_string())?;
        assert_eq!(
            s.config,
            pdbmux_core::config::Config::with_backends(s.config.backends.clone())
        );
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.log_level, "info");

        // Uncommenting the backends example works too.
        jail.set_env("PDBMUX_BACKENDS", "");
        let text = std::fs::read_to_string(&path).expect("read");
        let uncommented: String = text
            .lines()
            .map(|l| {
                if l.starts_with("# backends:") || l.starts_with("#   ") {
                    l.trim_start_matches('#')
                        .strip_prefix(' ')
                        .unwrap_or(l)
                        .to_owned()
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, uncommented).expect("write");
        let loaded = load(&flags(&["--config", &p]), &env_of(jail)).map_err(|e| e.to_string())?;
        let s = validate(&loaded).map_err(|e| e.to_string())?;
        let names: Vec<&str> = s.config.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["pdb-a", "pdb-b"]);
        assert_eq!(
            s.config.backends[1].tls.key_file,
            Some(PathBuf::from("/etc/pdbmux/client-key.pem"))
        );
        Ok(())
    });
}

#[test]
fn show_lines_and_sources() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = jail.directory().join("cfg.yaml");
        std::fs::write(
            &file,
            "timeout: 20s\ntls_ca_file: /etc/pdbmux/ca.pem\nbackends:\n  - name: pdb-a\n    url: https://pdb-a.example.com:8081\n    tls_cert_file: /etc/pdbmux/a.pem\n    tls_key_file: /etc/pdbmux/a-key.pem\n",
        )
        .expect("write");
        let f = file.display().to_string();
        jail.set_env("PDBMUX_FACTS_TTL", "600s");
        jail.set_env("PDBMUX_HEALTH_PROBE_FAILURES", "4");
        let (code, out, err, served) = run(
            &env_of(jail),
            &["config", "show", "--config", &f, "--listen", ":9000"],
        );
        assert_eq!((code, err.as_str()), (0, ""), "{out}");
        assert!(served.is_none());
        let lines: Vec<&str> = out.lines().collect();
        for want in [
            format!("config : {f}  (--config)"),
            "listen : 0.0.0.0:9000  (flag --listen)".to_owned(),
            "metrics_listen : 0.0.0.0:9180  (default)".to_owned(),
            format!("backends[0] : pdb-a=https://pdb-a.example.com:8081  (file {f})"),
            format!("backends[0].tls_ca_file : /etc/pdbmux/ca.pem  (file {f})"),
            format!("backends[0].tls_cert_file : /etc/pdbmux/a.pem  (file {f})"),
            format!("backends[0].tls_key_file : /etc/pdbmux/a-key.pem  (file {f})"),
            "merge : freshness  (default)".to_owned(),
            format!("timeout : 20s  (file {f})"),
            "freshness_ttl : 30s  (default)".to_owned(),
            "facts_ttl : 30s (clamped from 600s, cap 30s)  (env PDBMUX_FACTS_TTL)".to_owned(),
            "history_ttl : 15s  (default)".to_owned(),
            "aggregate_ttl : 15s  (default)".to_owned(),
            "cache_refresh_ahead_percent : 80  (default)".to_owned(),
            "facts_cache_bytes : 67108864  (default)".to_owned(),
            "source_fact_enabled : true  (default)".to_owned(),
            "health_probe_failures : 4  (env PDBMUX_HEALTH_PROBE_FAILURES)".to_owned(),
            "client_header_timeout : 30s  (default)".to_owned(),
            "client_send_timeout : 1m  (default)".to_owned(),
            "latency_objective : 2s  (default)".to_owned(),
            format!("tls_ca_file : /etc/pdbmux/ca.pem  (file {f})"),
            "tls_key_file : (none)  (default)".to_owned(),
            "log_format : text  (default)".to_owned(),
            "log_level : info  (default)".to_owned(),
            "config_watch_interval : 0s  (default)".to_owned(),
        ] {
            assert!(
                lines.contains(&want.as_str()),
                "missing {want:?} in:\n{out}"
            );
        }
        // One line per key plus the config line and the backend's TLS lines.
        assert_eq!(lines.len(), 1 + key_names().count() + 3, "{out}");
        assert!(!out.contains("BEGIN"), "never key contents");
        Ok(())
    });
}

#[test]
fn show_search_paths_and_rust_log() {
    Jail::expect_with(|jail| {
        clean(jail);
        jail.set_env("PDBMUX_BACKENDS", "pdb-a=http://pdb-a.example.com");
        jail.set_env("RUST_LOG", "debug");
        let env = env_of(jail);
        let (code, out, _, _) = run(&env, &["config", "show"]);
        assert_eq!(code, 0);
        let home = jail.directory().join(".config/pdbmux/config.yaml");
        let system = jail.directory().join("etc/pdbmux/config.yaml");
        assert_eq!(
            out.lines().next(),
            Some(
                format!(
                    "config : none  (searched {}, {})",
                    home.display(),
                    system.display()
                )
                .as_str()
            )
        );
        assert!(
            out.contains("\nbackends[0] : pdb-a=http://pdb-a.example.com  (env PDBMUX_BACKENDS)\n")
        );
        assert!(
            out.contains("\nlog_level : debug  (env RUST_LOG)\n"),
            "{out}"
        );
        Ok(())
    });
}

#[test]
fn show_with_invalid_values_prints_and_fails() {
    let env = Environment::from_pairs([("PDBMUX_TIMEOUT", "ten"), ("HOME", "/nonexistent-home")])
        .with_system_config("/nonexistent-etc/config.yaml");
    let (code, out, err, _) = run(&env, &["config", "show"]);
    assert_eq!(code, 2);
    assert!(
        out.contains("\ntimeout : \"ten\" (invalid)  (env PDBMUX_TIMEOUT)\n"),
        "{out}"
    );
    assert!(out.contains("\nbackends : (none)  (not set)\n"), "{out}");
    assert!(
        out.contains("\nlisten : 0.0.0.0:8080  (default)\n"),
        "{out}"
    );
    assert_eq!(
        err,
        "pdbmux: backends: none configured (set backends in a config file or PDBMUX_BACKENDS=name=url,...)\n\
         pdbmux: env PDBMUX_TIMEOUT: timeout: invalid duration \"ten\": expected a number at \"ten\" (e.g. 10s, 500ms, 1m30s)\n"
    );

    // The same through the library call.
    let loaded = load(&SettingFlags::default(), &env).expect("load");
    let shown = show(&loaded);
    assert_eq!(shown.result.expect_err("invalid").problems.len(), 2);
}

#[test]
fn serve_is_the_default_and_gets_settings() {
    let env = Environment::from_pairs([
        ("PDBMUX_BACKENDS", "pdb-a=http://pdb-a.example.com:8080"),
        ("PDBMUX_FACTS_TTL", "10m"),
    ])
    .with_system_config("/nonexistent-etc/config.yaml");
    for argv in [&[][..], &["serve"][..], &["--merge", "static"][..]] {
        let (code, out, err, served) = run(&env, argv);
        assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""), "{argv:?}");
        let settings = served.expect("serve called");
        assert_eq!(settings.config.backends[0].name, "pdb-a");
        assert_eq!(settings.config.facts_ttl, Duration::from_secs(30));
        assert_eq!(
            settings.config_source,
            "none (searched /nonexistent-etc/config.yaml)"
        );
    }
    let (_, _, _, served) = run(&env, &["serve", "--merge", "static"]);
    assert_eq!(
        served.expect("serve called").config.merge,
        pdbmux_core::config::MergeStrategy::Static
    );
    // A flag belongs to the command it is given to: before another command it is refused.
    let (code, _, err, served) = run(&env, &["--merge", "static", "serve"]);
    assert_eq!(code, 2);
    assert!(served.is_none());
    assert!(
        err.contains("the subcommand 'serve' cannot be used with '--merge"),
        "{err}"
    );
}

/// Each command's help lists its own flags, and says true things of them.
#[test]
fn each_command_shows_only_its_own_flags() {
    let env = Environment::from_pairs([("HOME", "/nonexistent-home")]);
    let help = |argv: &[&str]| {
        let (code, out, err, _) = run(&env, argv);
        assert_eq!((code, err.as_str()), (0, ""), "{argv:?}");
        out
    };
    let flags_of = |text: &str| -> Vec<String> {
        let mut flags: Vec<String> = text
            .lines()
            .map(str::trim_start)
            .filter(|line| line.starts_with('-'))
            .filter_map(|line| line.split_whitespace().find(|w| w.starts_with("--")))
            .map(str::to_owned)
            .collect();
        flags.sort();
        flags
    };
    let serve_flags = [
        "--config",
        "--health-probe",
        "--help",
        "--listen",
        "--log-format",
        "--merge",
    ];
    assert_eq!(flags_of(&help(&["serve", "--help"])), serve_flags);
    assert_eq!(flags_of(&help(&["config", "show", "--help"])), serve_flags);
    assert_eq!(
        flags_of(&help(&["config", "init", "--help"])),
        ["--config", "--force", "--help"]
    );
    assert_eq!(flags_of(&help(&["version", "--help"])), ["--help"]);
    assert_eq!(flags_of(&help(&["config", "--help"])), ["--help"]);

    let init = help(&["config", "init", "--help"]);
    assert!(init.contains("File to write"), "{init}");
    assert!(!init.contains("must exist"), "init writes the file: {init}");
    let serve = help(&["serve", "--help"]);
    assert!(
        serve.contains("Config file to read; it must exist"),
        "{serve}"
    );
    assert!(!serve.contains("How /facts picks"), "{serve}");
    assert!(serve.contains("its facts, catalog and reports"), "{serve}");
}

#[test]
fn serve_errors_and_exit_codes() {
    let env = Environment::from_pairs([("HOME", "/nonexistent-home")])
        .with_system_config("/nonexistent-etc/config.yaml");
    // Config error: 2, serve never called.
    let (code, _, err, served) = run(&env, &[]);
    assert_eq!(code, 2);
    assert!(served.is_none());
    assert!(
        err.starts_with("pdbmux: backends: none configured"),
        "{err}"
    );

    // Missing --config: 2.
    let (code, _, err, _) = run(&env, &["--config", "/nonexistent-dir/pdbmux.yaml"]);
    assert_eq!(code, 2);
    assert_eq!(
        err,
        "pdbmux: config file \"/nonexistent-dir/pdbmux.yaml\" not found (given by --config)\n"
    );

    // A serve error: 1, printed with the binary name.
    let env = Environment::from_pairs([("PDBMUX_BACKENDS", "a=http://a.example.com")])
        .with_system_config("/nonexistent-etc/config.yaml");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run_with(
        "pdbmux-smol",
        ["pdbmux-smol", "serve"],
        &env,
        &mut out,
        &mut err,
        |_, _| Err("bind 0.0.0.0:8080: address in use".into()),
    );
    assert_eq!(code, 1);
    assert_eq!(
        String::from_utf8_lossy(&err),
        "pdbmux-smol: bind 0.0.0.0:8080: address in use\n"
    );
}

#[test]
fn usage_errors_help_and_version() {
    let env = Environment::from_pairs([("HOME", "/nonexistent-home")]);
    let (code, _, err, _) = run(&env, &["--merge", "fresh"]);
    assert_eq!(code, 2);
    assert!(err.contains("invalid value 'fresh' for '--merge"), "{err}");

    let (code, _, err, _) = run(&env, &["bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("unrecognized subcommand 'bogus'"), "{err}");

    let (code, out, _, _) = run(&env, &["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("Usage: pdbmux [OPTIONS]\n       pdbmux <COMMAND>"),
        "{out}"
    );
    for word in [
        "serve",
        "config",
        "version",
        "--config",
        "--listen",
        "--merge",
        "--health-probe",
        "--log-format",
    ] {
        assert!(out.contains(word), "help lacks {word}:\n{out}");
    }

    let want = format!("pdbmux {}\n", pdbmux_cli::version());
    let (code, out, _, _) = run(&env, &["version"]);
    assert_eq!((code, out.as_str()), (0, want.as_str()));
    let (code, out, _, _) = run(&env, &["--version"]);
    assert_eq!((code, out.as_str()), (0, want.as_str()));
    assert_eq!(
        pdbmux_cli::version(),
        option_env!("PDBMUX_BUILD_VERSION").unwrap_or(env!("CARGO_PKG_VERSION"))
    );

    // The binary name comes from the caller.
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run_with(
        "pdbmux-smol",
        ["x", "version"],
        &env,
        &mut out,
        &mut err,
        |_, _| Ok(()),
    );
    assert_eq!(code, 0);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("pdbmux-smol {}\n", pdbmux_cli::version())
    );
}

#[test]
fn json_log_format_from_flag_reaches_serve() {
    let env = Environment::from_pairs([("PDBMUX_BACKENDS", "a=http://a.example.com")])
        .with_system_config("/nonexistent-etc/config.yaml");
    let (code, _, _, served) = run(&env, &["--log-format", "json", "--health-probe", "false"]);
    assert_eq!(code, 0);
    let settings = served.expect("serve called");
    assert_eq!(settings.log_format, LogFormat::Json);
    assert!(!settings.config.health_probe_enabled);
}

/// What `pdbmux serve` prints for a file and an environment with a mistake of each kind: every
/// line names where the value came from (the file's line, the variable), near misses get a
/// suggestion, and nothing starts.
#[test]
fn serve_names_the_source_of_every_problem() {
    Jail::expect_with(|jail| {
        clean(jail);
        let file = jail.directory().join("pdbmux.yaml");
        std::fs::write(
            &file,
            "# pdbmux\n\
             listen: 127.0.0.1:8080\n\
             freshness_ttl: 30\n\
             timout: 5s\n\
             backends:\n\
             \x20 - name: pdb-a\n\
             \x20   url: ftp://pdb-a.example.com\n\
             \x20 - name: pdb-b\n\
             \x20   url: http://pdb-b.example.com\n\
             \x20   tls_ca: /etc/pdbmux/ca.pem\n",
        )
        .expect("write");
        jail.set_env("PDBMUX_TIMOUT", "5s");
        jail.set_env("PDBMUX_HEALTH_PROBE_INTERVAL", "10S");
        let f = file.display().to_string();
        let (code, out, err, settings) = run(&env_of(jail), &["--config", &f]);
        assert_eq!(code, 2);
        assert!(settings.is_none(), "nothing may start");
        assert_eq!(out, "");
        let units = "(units: ns, us or µs, ms, s, m, h; e.g. 10s, 500ms, 1m30s)";
        assert_eq!(
            err.lines().collect::<Vec<_>>(),
            [
                format!("pdbmux: {f}:4: timout: unknown key (did you mean timeout?)"),
                "pdbmux: PDBMUX_TIMOUT: unknown variable (did you mean PDBMUX_TIMEOUT?)".to_owned(),
                format!("pdbmux: {f}:10: backends[1]: unknown key \"tls_ca\" (did you mean tls_ca_file?)"),
                format!("pdbmux: {f}:7: backends[0].url: \"ftp://pdb-a.example.com\" is not http(s)://host[:port]: scheme \"ftp\" is not http or https"),
                format!("pdbmux: {f}:3: freshness_ttl: invalid duration \"30\": missing unit (e.g. 10s, 500ms, 1m30s)"),
                format!("pdbmux: env PDBMUX_HEALTH_PROBE_INTERVAL: health_probe_interval: invalid duration \"10S\": unknown unit \"S\" {units}"),
            ]
        );
        Ok(())
    });
}
