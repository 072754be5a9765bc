//! PQL translations a backend gave (docs/merging.md, "PQL and the root endpoint"), kept so a
//! repeated PQL query costs no extra round trip. A translation depends only on the PQL text and
//! the PuppetDB version, so entries are kept for [`TTL`] (long enough for a dashboard's repeated
//! queries, short enough that a PuppetDB upgrade is picked up soon), at most [`CAPACITY`] of them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::Config;
use crate::message::{Response, ResponseBody};
use crate::parsed::ParsedRequest;
use crate::policy::Planned;
use crate::root::{Pql, Translating};

/// How long a translation is used.
pub(crate) const TTL: Duration = Duration::from_secs(15 * 60);

/// How many translations are kept; the oldest goes first.
pub(crate) const CAPACITY: usize = 1024;

/// The translations, by PQL text: the AST body and when it was stored.
#[derive(Debug, Default)]
pub(crate) struct Translations {
    entries: BTreeMap<String, (Bytes, Instant)>,
}

impl Translations {
    /// The plan of `pql` from a kept translation, if one is kept and maps onto a query.
    pub(crate) fn planned(
        &self,
        now: Instant,
        (pql, request): (&Pql, &Arc<ParsedRequest>),
        config: &Arc<Config>,
    ) -> Option<Planned> {
        crate::policy::plan_translated(self.get(now, &pql.text)?, pql, request, config)
    }

    /// A translation request responded: the plan of the query it translates to (the
    /// translation kept), or the answer to give: a refusal (PuppetDB's 400 for bad PQL) or a
    /// 502 replayed, and 502 for a 200 that is not a query AST.
    pub(crate) fn learn(
        &mut self,
        now: Instant,
        (translating, response): (Translating, Response),
        config: &Arc<Config>,
    ) -> Result<Planned, Box<Response>> {
        let ResponseBody::Full(body) = &response.body else {
            return Err(Box::new(response));
        };
        if !response.status.is_success() {
            return Err(Box::new(response));
        }
        let Translating { pql, request } = translating;
        match crate::policy::plan_translated(body, &pql, &request, config) {
            Some(planned) => {
                self.put(now, &pql.text, body.clone());
                Ok(planned)
            }
            None => Err(Box::new(Response::text(
                http::StatusCode::BAD_GATEWAY,
                "pdbmux: the backend's translation of the PQL query is not a query AST",
            ))),
        }
    }

    /// The translation of `pql`, if one is kept and younger than [`TTL`].
    pub(crate) fn get(&self, now: Instant, pql: &str) -> Option<&Bytes> {
        self.entries
            .get(pql)
            .filter(|(_, stored)| now.saturating_duration_since(*stored) < TTL)
            .map(|(body, _)| body)
    }

    /// Keeps `body` as the translation of `pql`, making room by dropping expired entries, then
    /// the oldest one.
    pub(crate) fn put(&mut self, now: Instant, pql: &str, body: Bytes) {
        if self.entries.len() >= CAPACITY && !self.entries.contains_key(pql) {
            self.entries
                .retain(|_, (_, stored)| now.saturating_duration_since(*stored) < TTL);
            if self.entries.len() >= CAPACITY {
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, stored))| *stored)
                    .map(|(pql, _)| pql.clone());
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(pql.to_owned(), (body, now));
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests need one real instant to start from
mod tests {
    use super::*;

    #[test]
    fn kept_for_the_ttl_and_bounded_oldest_first() {
        let t0 = Instant::now();
        let mut translations = Translations::default();
        translations.put(t0, "nodes {}", Bytes::from_static(b"[\"from\",\"nodes\"]"));
        assert!(translations.get(t0 + TTL / 2, "nodes {}").is_some());
        assert!(translations.get(t0 + TTL, "nodes {}").is_none(), "expired");
        for i in 0..CAPACITY {
            translations.put(
                t0 + Duration::from_millis(i as u64),
                &format!("q{i}"),
                Bytes::new(),
            );
        }
        assert_eq!(translations.entries.len(), CAPACITY);
        assert!(
            translations.get(t0, "nodes {}").is_none(),
            "the oldest went first"
        );
        assert!(translations.get(t0, "q0").is_some());
    }
}
