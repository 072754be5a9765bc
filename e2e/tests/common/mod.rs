//! Helpers shared by the e2e test targets (`mod common;` in each). They panic with a message:
//! in a test, the panic is the failure report.

#![allow(dead_code)] // each test target uses its own subset

use pdbmux_e2e::{Backend, E2eEnv, Pdbmux, Response};
use serde_json::{json, Value};

/// The harness's environment (PDBMUX_E2E_*), read once.
pub fn env() -> &'static E2eEnv {
    E2eEnv::shared()
        .unwrap_or_else(|e| panic!("e2e environment (run the suite through e2e/run): {e}"))
}

/// A pdbmux in front of every backend with the harness defaults; `label` names its log file.
pub fn pdbmux(label: &str) -> Pdbmux {
    env()
        .pdbmux()
        .label(label)
        .spawn()
        .unwrap_or_else(|e| panic!("start pdbmux in front of both backends: {e}"))
}

/// GET through pdbmux with form-encoded `params`.
pub fn get(p: &Pdbmux, path: &str, params: &[(&str, &str)]) -> Response {
    p.get_query(path, params)
        .unwrap_or_else(|e| panic!("GET {path} {params:?} through pdbmux: {e}"))
}

/// GET from a backend directly with form-encoded `params`.
pub fn direct(b: &Backend, path: &str, params: &[(&str, &str)]) -> Response {
    b.get_query(path, params)
        .unwrap_or_else(|e| panic!("GET {path} {params:?} from {} directly: {e}", b.name))
}

/// A response body as JSON.
pub fn json_of(r: &Response) -> Value {
    r.json().unwrap_or_else(|e| panic!("{e}"))
}

/// `["=","certname",<certname>]` as query text.
pub fn certname_query(certname: &str) -> String {
    json!(["=", "certname", certname]).to_string()
}

/// The first certname of a scenario.
pub fn node_of(scenario: &str) -> &'static str {
    env()
        .fixture
        .scenario(scenario)
        .first()
        .copied()
        .unwrap_or_else(|| panic!("the fixture has no {scenario} node"))
}
