//! `/fact-names`: the sorted, deduped union of the backends' name arrays, paged here (never
//! upstream), with the provenance fact's name listed once while injection is on.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::{BackendPage, Merged, RecordPlan};
use crate::sort::Direction;
use crate::status::Unusable;

pub(crate) fn merge(plan: &RecordPlan, answers: &[BackendPage<'_>]) -> Merged {
    let mut unusable = Vec::new();
    let mut names: BTreeSet<Cow<'_, str>> = BTreeSet::new();
    let mut contributed = 0;
    for answer in answers {
        match serde_json::from_slice::<Vec<Cow<'_, str>>>(answer.body) {
            Ok(list) => {
                contributed += 1;
                names.extend(list);
            }
            Err(error) => unusable.push((answer.backend, Unusable::Unparseable(error.to_string()))),
        }
    }
    if contributed == 0 {
        return Merged::nothing(unusable);
    }
    let config = plan.config();
    if config.source_fact_enabled {
        names.insert(Cow::Owned(config.source_fact.clone()));
    }
    let descending = plan
        .order
        .as_ref()
        .and_then(|order| order.fields.first())
        .is_some_and(|field| field.direction == Direction::Descending);
    let merged = names.len();
    let ordered: Vec<Cow<'_, str>> = if descending {
        names.into_iter().rev().collect()
    } else {
        names.into_iter().collect()
    };
    let window = plan.window.apply(ordered);
    let body = serde_json::to_vec(&window).unwrap_or_else(|_| b"[]".to_vec());
    Merged {
        body: Ok((body, merged)),
        contributed,
        unusable,
    }
}
