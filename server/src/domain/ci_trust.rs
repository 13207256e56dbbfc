//! What a CI trust policy asks of an ID token: claim name → pattern, every one of which must
//! match. A pattern is the exact value, with `*` standing for any run of characters (none
//! included), so `refs/heads/release/*` admits every release branch. Patterns apply to string
//! claims only: a claim that is missing, a number or a list never matches.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::FieldError;

/// Claims a condition may not name: the verifier checks them itself (`iss` against the
/// policy's issuer, `aud` against its audience, the times against the clock), and a policy
/// resting on them alone would admit every repository of the CI system.
pub const RESERVED_CLAIMS: &[&str] = &["iss", "aud", "azp", "exp", "iat", "nbf", "jti"];

/// Most conditions in one policy.
pub const MAX_CONDITIONS: usize = 32;
/// Longest claim name.
const MAX_CLAIM_NAME: usize = 100;
/// Longest pattern.
const MAX_PATTERN: usize = 500;

/// A policy's conditions, checked: at least one, none on a reserved claim, each pattern
/// usable (not empty, not `*` alone, no control characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions(BTreeMap<String, String>);

impl Conditions {
    /// Checks `conditions`, reporting each failure under `field.<claim>` (or `field` itself
    /// when there are none or too many).
    pub fn parse(field: &str, conditions: &BTreeMap<String, String>) -> Result<Self, Vec<FieldError>> {
        if conditions.is_empty() {
            return Err(vec![FieldError::new(
                field,
                "empty",
                "must hold at least one claim and its pattern (e.g. `repository`), or every repository of the \
                 CI system would be admitted",
            )]);
        }
        if conditions.len() > MAX_CONDITIONS {
            return Err(vec![FieldError::new(field, "too_many", format!("may hold at most {MAX_CONDITIONS} claims"))]);
        }
        let mut errors = Vec::new();
        for (claim, pattern) in conditions {
            let at = format!("{field}.{claim}");
            if let Err(e) = check_claim(&at, claim) {
                errors.push(e);
            } else if let Err(e) = check_pattern(&at, pattern) {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(Self(conditions.clone()))
        } else {
            Err(errors)
        }
    }

    /// The conditions, claim by claim.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

fn check_claim(field: &str, claim: &str) -> Result<(), FieldError> {
    if claim.is_empty() {
        return Err(FieldError::new(field, "empty", "a claim name must not be empty"));
    }
    if claim.chars().count() > MAX_CLAIM_NAME {
        return Err(FieldError::new(
            field,
            "too_long",
            format!("a claim name has at most {MAX_CLAIM_NAME} characters"),
        ));
    }
    if claim.chars().any(char::is_control) {
        return Err(FieldError::new(field, "control_character", "a claim name must not contain control characters"));
    }
    if RESERVED_CLAIMS.contains(&claim) {
        return Err(FieldError::new(
            field,
            "reserved_claim",
            format!(
                "`{claim}` is checked by the policy itself (`issuer`, `audience`, the token's times); name the \
                 claims that say which pipeline may come in, e.g. `repository` or `sub`"
            ),
        ));
    }
    Ok(())
}

fn check_pattern(field: &str, pattern: &str) -> Result<(), FieldError> {
    if pattern.is_empty() {
        return Err(FieldError::new(field, "empty", "the pattern must not be empty"));
    }
    if pattern.chars().count() > MAX_PATTERN {
        return Err(FieldError::new(field, "too_long", format!("the pattern has at most {MAX_PATTERN} characters")));
    }
    if pattern.chars().any(char::is_control) {
        return Err(FieldError::new(field, "control_character", "the pattern must not contain control characters"));
    }
    if pattern.chars().all(|c| c == '*') {
        return Err(FieldError::new(
            field,
            "matches_anything",
            "a pattern of `*` alone admits any value; name the value, with `*` only for the part that varies",
        ));
    }
    Ok(())
}

/// Whether `claims` satisfy every one of `conditions`. No conditions admit nothing: a stored
/// policy is never read as "anyone".
pub fn admits(conditions: &BTreeMap<String, String>, claims: &Map<String, Value>) -> bool {
    !conditions.is_empty()
        && conditions.iter().all(|(claim, pattern)| {
            claims.get(claim).and_then(Value::as_str).is_some_and(|value| matches(pattern, value))
        })
}

/// Whether `value` matches `pattern`, where `*` stands for any run of characters and every
/// other character for itself. Greedy with one backtrack point, so linear in practice and
/// never worse than the product of the lengths (both are bounded).
pub fn matches(pattern: &str, value: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let value: Vec<char> = value.chars().collect();
    let (mut p, mut v) = (0, 0);
    // The last `*` seen and the value position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while v < value.len() {
        if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, v));
            p += 1;
        } else if p < pattern.len() && pattern[p] == value[v] {
            p += 1;
            v += 1;
        } else if let Some((star_p, star_v)) = star {
            // Let the last `*` take one more character and try again after it.
            p = star_p + 1;
            v = star_v + 1;
            star = Some((star_p, star_v + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn claims(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("the tests pass objects"),
        }
    }

    #[test]
    fn a_pattern_is_exact_except_for_its_stars() {
        assert!(matches("acme/train", "acme/train"));
        assert!(!matches("acme/train", "acme/train2"));
        assert!(!matches("acme/train", "acme/trai"));
        assert!(!matches("acme/train", "Acme/train"), "claims are compared case by case");
        assert!(matches("refs/heads/release/*", "refs/heads/release/1.2"));
        assert!(matches("refs/heads/release/*", "refs/heads/release/"), "a star may stand for nothing");
        assert!(matches("refs/heads/release/*", "refs/heads/release/v1/hotfix"), "a star crosses slashes");
        assert!(!matches("refs/heads/release/*", "refs/heads/main"));
        assert!(matches("repo:acme/*:ref:refs/heads/main", "repo:acme/train:ref:refs/heads/main"));
        assert!(!matches("repo:acme/*:ref:refs/heads/main", "repo:acme/train:ref:refs/heads/dev"));
        assert!(matches("*-prod", "eu-prod"));
        assert!(matches("a*b*c", "aXXbYYbc"), "the first star gives way when the rest does not fit");
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("a**", "abc"));
        assert!(matches("é*", "éte"), "characters, not bytes");
    }

    #[test]
    fn every_condition_must_match_a_string_claim() {
        let conditions = map(&[("repository", "acme/train"), ("ref", "refs/heads/*")]);
        let token = claims(json!({"repository": "acme/train", "ref": "refs/heads/main", "run_id": 7}));
        assert!(admits(&conditions, &token));
        let other_repo = claims(json!({"repository": "evil/train", "ref": "refs/heads/main"}));
        assert!(!admits(&conditions, &other_repo));
        let missing = claims(json!({"repository": "acme/train"}));
        assert!(!admits(&conditions, &missing), "a claim the token lacks never matches");
        let number = map(&[("run_id", "7")]);
        assert!(!admits(&number, &token), "patterns apply to string claims only");
        assert!(!admits(&BTreeMap::new(), &token), "no conditions admit nothing");
    }

    #[test]
    fn conditions_need_one_claim_and_refuse_reserved_claims_and_patterns_that_admit_anything() {
        assert!(Conditions::parse("conditions", &map(&[("repository", "acme/*")])).is_ok());
        assert_eq!(Conditions::parse("conditions", &BTreeMap::new()).unwrap_err()[0].code, "empty");
        let errors = Conditions::parse("conditions", &map(&[("aud", "fairway"), ("ref", "*")])).unwrap_err();
        let found: Vec<(&str, &str)> = errors.iter().map(|e| (e.field.as_str(), e.code.as_str())).collect();
        assert_eq!(found, [("conditions.aud", "reserved_claim"), ("conditions.ref", "matches_anything")]);
        let errors = Conditions::parse("conditions", &map(&[("sub", ""), ("x\u{0}", "y")])).unwrap_err();
        let codes: Vec<&str> = errors.iter().map(|e| e.code.as_str()).collect();
        assert_eq!(codes, ["empty", "control_character"]);
        let many: BTreeMap<String, String> = (0..=MAX_CONDITIONS).map(|i| (format!("c{i}"), "v".to_owned())).collect();
        assert_eq!(Conditions::parse("conditions", &many).unwrap_err()[0].code, "too_many");
    }
}
