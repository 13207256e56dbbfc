//! The idempotency key a submission gets inside a CI job, so that a retried step never
//! submits twice, while two different submissions in one CI job do not collide.
//!
//! The key is `ci:<system>:<the CI job's identity>:<first 16 hex digits of the SHA-256 of the
//! request body>`. The identity changes when the CI system runs the job anew (a new run, a
//! "re-run" in GitHub, a retried GitLab job) and stays while the same job repeats a step.

use sha2::{Digest as _, Sha256};

/// The longest key the server takes.
const MAX_KEY: usize = 255;

/// A CI system and the variables that name one of its jobs.
struct System {
    /// Its name in the key.
    name: &'static str,
    /// How to tell it runs us: a variable and, when it matters, the value it must have.
    detect: (&'static str, Option<&'static str>),
    /// The variables that together name the CI job, in the key's order.
    identity: &'static [&'static str],
}

const SYSTEMS: &[System] = &[
    System {
        name: "github",
        detect: ("GITHUB_ACTIONS", Some("true")),
        identity: &["GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_JOB"],
    },
    System { name: "gitlab", detect: ("GITLAB_CI", None), identity: &["CI_PROJECT_ID", "CI_JOB_ID"] },
    System { name: "jenkins", detect: ("JENKINS_URL", None), identity: &["BUILD_TAG"] },
    System { name: "buildkite", detect: ("BUILDKITE", Some("true")), identity: &["BUILDKITE_JOB_ID"] },
];

/// Every variable the detection reads, so tests can run the client with none of them.
pub const VARIABLES: &[&str] = &[
    "GITHUB_ACTIONS",
    "GITHUB_REPOSITORY",
    "GITHUB_RUN_ID",
    "GITHUB_RUN_ATTEMPT",
    "GITHUB_JOB",
    "GITLAB_CI",
    "CI_PROJECT_ID",
    "CI_JOB_ID",
    "JENKINS_URL",
    "BUILD_TAG",
    "BUILDKITE",
    "BUILDKITE_JOB_ID",
];

/// What CI detection found.
#[derive(Debug, PartialEq, Eq)]
pub enum Detected {
    /// Not in a CI system the client knows.
    None,
    /// In a CI system, with the key for this body.
    Key(String),
    /// In a CI system whose job identity is incomplete: no key can be made safely.
    Incomplete {
        /// The system's name.
        system: &'static str,
        /// The first variable that is missing.
        missing: &'static str,
    },
}

/// The key for a submission of `body` (the exact bytes sent), reading the environment through
/// `var` (`std::env::var` in the binary; a map in tests).
pub fn idempotency_key(var: impl Fn(&str) -> Option<String>, body: &[u8]) -> Detected {
    let present = |name: &str| var(name).filter(|v| !v.is_empty());
    let Some(system) = SYSTEMS.iter().find(|s| match s.detect {
        (name, Some(value)) => present(name).is_some_and(|v| v.eq_ignore_ascii_case(value)),
        (name, None) => present(name).is_some(),
    }) else {
        return Detected::None;
    };
    let mut parts = Vec::with_capacity(system.identity.len());
    for name in system.identity {
        match present(name) {
            Some(value) => parts.push(value),
            None => return Detected::Incomplete { system: system.name, missing: name },
        }
    }
    let mut identity = parts.join("/");
    let body_digest = &hex(&Sha256::digest(body))[..16];
    let key = |identity: &str| format!("ci:{}:{identity}:{body_digest}", system.name);
    // The server takes 1 to 255 visible ASCII characters; a Jenkins job name may hold spaces
    // or more. A long identity is replaced by its digest, which still names the CI job.
    identity = identity.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect();
    if key(&identity).len() > MAX_KEY {
        identity = hex(&Sha256::digest(identity.as_bytes()));
    }
    Detected::Key(key(&identity))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| map.get(name).cloned()
    }

    const GITHUB: &[(&str, &str)] = &[
        ("GITHUB_ACTIONS", "true"),
        ("GITHUB_REPOSITORY", "acme/vision"),
        ("GITHUB_RUN_ID", "9876"),
        ("GITHUB_RUN_ATTEMPT", "1"),
        ("GITHUB_JOB", "train"),
    ];

    fn key(pairs: &[(&str, &str)], body: &[u8]) -> String {
        match idempotency_key(env(pairs), body) {
            Detected::Key(key) => key,
            other => panic!("no key: {other:?}"),
        }
    }

    #[test]
    fn outside_ci_there_is_no_key() {
        assert_eq!(idempotency_key(env(&[]), b"{}"), Detected::None);
        // GitHub sets the variable to `true`; anything else is not GitHub.
        assert_eq!(idempotency_key(env(&[("GITHUB_ACTIONS", "false")]), b"{}"), Detected::None);
        assert_eq!(idempotency_key(env(&[("GITLAB_CI", "")]), b"{}"), Detected::None);
    }

    #[test]
    fn a_github_job_gets_its_run_attempt_and_job_with_the_bodys_digest() {
        let body = br#"{"name":"train"}"#;
        let digest = &hex(&Sha256::digest(body))[..16];
        assert_eq!(key(GITHUB, body), format!("ci:github:acme/vision/9876/1/train:{digest}"));
    }

    #[test]
    fn a_retried_step_gets_the_same_key_and_another_submission_another() {
        assert_eq!(key(GITHUB, b"{\"a\":1}"), key(GITHUB, b"{\"a\":1}"));
        assert_ne!(key(GITHUB, b"{\"a\":1}"), key(GITHUB, b"{\"a\":2}"));
        // A re-run of the workflow is a new attempt: the job is submitted anew.
        let mut rerun = GITHUB.to_vec();
        rerun[3] = ("GITHUB_RUN_ATTEMPT", "2");
        assert_ne!(key(GITHUB, b"{}"), key(&rerun, b"{}"));
    }

    #[test]
    fn gitlab_jenkins_and_buildkite_name_their_jobs() {
        let gitlab = key(&[("GITLAB_CI", "true"), ("CI_PROJECT_ID", "42"), ("CI_JOB_ID", "7001")], b"{}");
        assert!(gitlab.starts_with("ci:gitlab:42/7001:"), "{gitlab}");
        let jenkins = key(&[("JENKINS_URL", "https://ci.example/"), ("BUILD_TAG", "jenkins-train-12")], b"{}");
        assert!(jenkins.starts_with("ci:jenkins:jenkins-train-12:"), "{jenkins}");
        let buildkite = key(&[("BUILDKITE", "true"), ("BUILDKITE_JOB_ID", "0189-ab")], b"{}");
        assert!(buildkite.starts_with("ci:buildkite:0189-ab:"), "{buildkite}");
    }

    #[test]
    fn a_ci_job_without_its_identity_gets_no_key_and_says_what_is_missing() {
        assert_eq!(
            idempotency_key(env(&[("GITHUB_ACTIONS", "true"), ("GITHUB_REPOSITORY", "a/b")]), b"{}"),
            Detected::Incomplete { system: "github", missing: "GITHUB_RUN_ID" }
        );
    }

    #[test]
    fn every_key_is_one_the_server_accepts() {
        let spaced = key(&[("JENKINS_URL", "x"), ("BUILD_TAG", "jenkins-my job-ü-1")], b"{}");
        assert!(spaced.starts_with("ci:jenkins:jenkins-my_job-_-1:"), "{spaced}");
        let long_tag = "x".repeat(400);
        let long = key(&[("JENKINS_URL", "x"), ("BUILD_TAG", &long_tag)], b"{}");
        assert!(long.len() <= MAX_KEY && long.chars().all(|c| c.is_ascii_graphic()), "{long}");
        assert_ne!(long, key(&[("JENKINS_URL", "x"), ("BUILD_TAG", &"y".repeat(400))], b"{}"));
    }
}
