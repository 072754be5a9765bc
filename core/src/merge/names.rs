//! `/fact-names`: the sorted, deduped union of the backends' name arrays, paged here (never
//! upstream), with the provenance fact's name listed once while injection is on.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::{Answer, Merged, RecordPlan};
use crate::sort::Direction;

pub(crate) fn merge(plan: &RecordPlan, answers: &[Answer<'_>]) -> Merged {
    let mut unusable = Vec::new();
    let mut names: BTreeSet<Cow<'_, str>> = BTreeSet::new();
    let mut contributed = 0;
    for answer in answers {
        match serde_json::from_slice::<Vec<Cow<'_, str>>>(answer.body) {
            Ok(list) => {
                contributed += 1;
                names.extend(list);
            }
            Err(error) => unusable.push((answer.backend, format!("unparseable body: {error}"))),
        }
    }
    if contributed == 0 {
        return Merged {
            response: None,
            contributed,
            unusable,
        };
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
    let response = plan.respond(body, plan.include_total.then_some(merged as u64));
    Merged {
        response: Some(response),
        contributed,
        unusable,
    }
}
