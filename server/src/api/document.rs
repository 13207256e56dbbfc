//! The last touches on the OpenAPI document, applied to every operation at once so no
//! handler can forget them:
//! - errors are declared as what they are on the wire, `application/problem+json` with the
//!   shared `Problem` schema (the handlers name the schema; this names the media type);
//! - every operation declares the errors any request to it can meet: `400` for a path or
//!   query that cannot be read, `401` where a credential is required, `503` when the
//!   database is briefly unreachable;
//! - every response has a description (the status's reason phrase where a handler gave none).

use axum::http::StatusCode;
use utoipa::openapi::{
    path::Operation,
    response::{Response, ResponseBuilder},
    Content, OpenApi, Ref, RefOr,
};

const PROBLEM: &str = "application/problem+json";
const PROBLEM_SCHEMA: &str = "#/components/schemas/Problem";

/// Applies the touches to `doc`.
pub fn finish(doc: &mut OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let operations =
            [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch, &mut item.head];
        for operation in operations.into_iter().flatten() {
            finish_operation(operation);
        }
    }
}

fn finish_operation(operation: &mut Operation) {
    // `security(())` on a handler renders as one empty requirement: no credential needed.
    let public = operation.security.as_ref().is_some_and(|s| {
        s.is_empty()
            || s.iter()
                .all(|r| serde_json::to_value(r).is_ok_and(|v| v.as_object().is_some_and(serde_json::Map::is_empty)))
    });
    let responses = &mut operation.responses.responses;
    if !public {
        responses.entry("401".into()).or_insert_with(|| problem("No valid credential (`unauthenticated`)"));
    }
    responses.entry("400".into()).or_insert_with(|| {
        problem("The request cannot be read: a path or query with a NUL or invalid UTF-8 (`malformed_request`)")
    });
    responses
        .entry("503".into())
        .or_insert_with(|| problem("The database is briefly unreachable, or the request timed out; retry"));
    for (status, response) in responses.iter_mut() {
        let RefOr::T(response) = response else { continue };
        if let Some(content) = response.content.shift_remove("application/json") {
            let is_problem = matches!(&content.schema, Some(RefOr::Ref(r)) if r.ref_location == PROBLEM_SCHEMA);
            let media = if is_problem { PROBLEM } else { "application/json" };
            response.content.insert(media.into(), content);
        }
        if response.description.trim().is_empty() {
            let reason = status.parse::<u16>().ok().and_then(|s| StatusCode::from_u16(s).ok());
            response.description = reason.and_then(|s| s.canonical_reason()).unwrap_or("Response").to_owned();
        }
    }
}

/// A response carrying the problem document.
fn problem(description: &str) -> RefOr<Response> {
    let content = Content::new(Some(Ref::new(PROBLEM_SCHEMA)));
    RefOr::T(ResponseBuilder::new().description(description).content(PROBLEM, content).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_problem_json_every_response_is_described_and_401_503_are_declared() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let mut checked = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let responses = operation["responses"].as_object().unwrap();
                assert!(responses.contains_key("503") && responses.contains_key("400"), "{method} {path}");
                let public =
                    operation["security"].as_array().is_some_and(|s| s.iter().all(|r| r == &serde_json::json!({})));
                if !public {
                    assert!(responses.contains_key("401"), "{method} {path} needs a credential");
                }
                for (status, response) in responses {
                    assert!(!response["description"].as_str().unwrap().is_empty(), "{method} {path} {status}");
                    if status.starts_with('4') || status.starts_with('5') {
                        let content = response["content"].as_object().unwrap();
                        assert!(!content.contains_key("application/json"), "{method} {path} {status}");
                        // Probes (`/readyz`) answer plain text; every API error is a problem.
                        if path.starts_with("/api/") {
                            assert!(content.contains_key(PROBLEM), "{method} {path} {status}: {content:?}");
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "{checked} responses checked");
    }

    #[test]
    fn the_documented_bounds_are_the_enforced_ones() {
        let doc = serde_json::to_value(super::super::openapi()).unwrap();
        let field = |schema: &str, name: &str| doc["components"]["schemas"][schema]["properties"][name].clone();
        let bounds = |v: serde_json::Value| (v["minimum"].as_i64(), v["maximum"].as_i64());
        use crate::domain::{MAX_BUDGET_AMOUNT, MAX_GPUS};
        assert_eq!(bounds(field("QuotaSpec", "reserved")), (Some(0), Some(MAX_GPUS)));
        assert_eq!(bounds(field("QuotaSpec", "burst")), (Some(0), Some(MAX_GPUS)));
        assert_eq!(bounds(field("BudgetSpec", "amount")), (Some(0), Some(MAX_BUDGET_AMOUNT)));
        assert_eq!(bounds(field("JobSpec", "replicas")), (Some(1), Some(1024)));
        assert_eq!(bounds(field("JobSpec", "gpus_per_replica")), (Some(1), Some(64)));
        assert_eq!(bounds(field("PriorityClassSpec", "priority")), (Some(-1_000_000), Some(1_000_000)));
    }
}
