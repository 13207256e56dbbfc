//! Reads a gang's state from its Service and Pods and normalises it into the backend's
//! [`Phase`] and [`Outcome`]. Pure: the watch caches supply the objects, the caller the node
//! liveness and the clock.
//!
//! A gang is judged as a whole: the first pod to fail decides its outcome, it runs when every
//! replica runs, and it succeeds when every replica exited 0. A pod that vanished after the
//! gang was complete, or one whose node is gone, makes the gang `NodeLost`.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Service};

use super::manifest::{
    COMPLETE_ANNOTATION, NODE_ANNOTATION, REPLICAS_ANNOTATION, STOP_ASKED_ANNOTATION, STOP_DEADLINE_ANNOTATION,
};
use crate::backends::{Outcome, Phase};

/// Container waiting reasons after which the pod will not start without a change to the job.
const FATAL_WAITING: &[&str] = &[
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// Pod failure reasons (`status.reason`) that are the node's fault, not the job's.
const NODE_REASONS: &[&str] = &["NodeLost", "Shutdown", "NodeShutdown", "Terminated", "Evicted", "NodeAffinity"];

/// A gang's phase and whether we asked it to stop.
pub fn gang_phase(
    service: Option<&Service>,
    pods: &[&Pod],
    lost_nodes: &HashSet<String>,
    now: DateTime<Utc>,
) -> (Phase, bool) {
    let annotations = service.and_then(|s| s.metadata.annotations.as_ref());
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    let instant =
        |key: &str| annotation(key).and_then(|d| DateTime::parse_from_rfc3339(d).ok()).map(|d| d.with_timezone(&Utc));
    let stop_deadline = instant(STOP_DEADLINE_ANNOTATION);
    let stop_asked = instant(STOP_ASKED_ANNOTATION);
    let replicas = gang_size(service, pods);
    let complete = annotation(COMPLETE_ANNOTATION).is_some_and(|v| v == "true");
    let started_at = pods.iter().map(|p| started(p)).collect::<Option<Vec<_>>>().and_then(|s| s.into_iter().max());
    let terminal = |p: &Pod| matches!(pod_phase(p), "Succeeded" | "Failed");
    let on_lost_node = pods.iter().any(|p| pod_node(p).is_some_and(|n| lost_nodes.contains(n)));
    // Exit 0 is success only when every pod ended before we asked the gang to stop (with a
    // margin for the kubelets' clocks): after the ask it is how an application answers
    // SIGTERM, and the job has work left. A stop asked before this annotation existed has no
    // instant, so its exit 0 counts as stopped, as it always did.
    let on_its_own = |p: &Pod| match stop_deadline {
        None => true,
        Some(_) => stop_asked.zip(finished(p)).is_some_and(|(asked, ended)| ended + CLOCK_MARGIN < asked),
    };
    let done = pods.len() >= replicas.max(1) && pods.iter().all(|p| pod_phase(p) == "Succeeded" && on_its_own(p));
    if done {
        let ended_at = pods.iter().filter_map(|p| finished(p)).max().unwrap_or(now);
        return (Phase::Finished { started_at, ended_at, outcome: Outcome::Succeeded }, stop_deadline.is_some());
    }

    if let Some(deadline) = stop_deadline {
        // We asked it to stop. The ask took effect once every pod left is being deleted; if
        // one is not (the delete failed), the reconciler asks again.
        let asked = pods.iter().all(|p| p.metadata.deletion_timestamp.is_some() || terminal(p));
        // It has stopped when no pod is left running, however its pods ended (SIGTERM's exit
        // code is not a failure), or when the kubelet will never confirm: the node is gone,
        // or the grace period passed long ago.
        let gone = pods.iter().all(|p| terminal(p));
        if gone || on_lost_node || now > deadline + STOP_SLACK {
            let ended_at = pods.iter().filter_map(|p| finished(p)).max().unwrap_or_else(|| now.min(deadline));
            return (Phase::Finished { started_at, ended_at, outcome: Outcome::Stopped }, asked);
        }
        return (running_or_pending(pods, replicas, started_at), asked);
    }

    // A replica that failed decides for the gang.
    let failed = pods.iter().filter_map(|p| failure(p, now).map(|f| (p, f))).min_by_key(|(_, (_, at))| *at);
    if let Some((_, (outcome, at))) = failed {
        let ended_at = at.unwrap_or(now);
        return (Phase::Finished { started_at, ended_at, outcome }, false);
    }
    // Pods someone else is deleting (a drain, an eviction) are on their way out.
    let disrupted = pods.iter().any(|p| p.metadata.deletion_timestamp.is_some());
    let vanished = complete && pods.len() < replicas;
    if on_lost_node || vanished {
        return (Phase::Finished { started_at, ended_at: now, outcome: Outcome::NodeLost }, disrupted);
    }
    (running_or_pending(pods, replicas, started_at), disrupted)
}

/// How many pods the gang has: the Service says, or else (its watch lags the pods') the pods
/// themselves. Only pods written before they carried the size fall back to those in view.
fn gang_size(service: Option<&Service>, pods: &[&Pod]) -> usize {
    let of = |annotations: Option<&BTreeMap<String, String>>| {
        annotations.and_then(|a| a.get(REPLICAS_ANNOTATION)).and_then(|r| r.parse::<usize>().ok())
    };
    of(service.and_then(|s| s.metadata.annotations.as_ref()))
        .or_else(|| pods.iter().filter_map(|p| of(p.metadata.annotations.as_ref())).max())
        .unwrap_or(pods.len())
}

/// After its stop deadline, a gang whose pods the kubelet has not confirmed gone is taken for
/// stopped (its node is unreachable, or its kubelet stuck).
const STOP_SLACK: chrono::Duration = chrono::Duration::seconds(60);

/// How far a kubelet's clock may be behind ours when a pod's end is compared with the
/// instant we asked its gang to stop.
const CLOCK_MARGIN: chrono::Duration = chrono::Duration::seconds(1);

/// A pod the scheduler cannot place this long (its pinned node was cordoned or filled behind
/// the engine's back) gives its GPUs back to be placed again.
const UNSCHEDULABLE_AFTER: chrono::Duration = chrono::Duration::minutes(5);

fn running_or_pending(pods: &[&Pod], replicas: usize, started_at: Option<DateTime<Utc>>) -> Phase {
    let all_up = pods.len() >= replicas.max(1) && pods.iter().all(|p| matches!(pod_phase(p), "Running" | "Succeeded"));
    match (all_up, started_at) {
        (true, Some(started_at)) => Phase::Running { started_at },
        _ => Phase::Pending,
    }
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// The node a pod runs on, or the one it was placed on while it is not bound yet.
pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .or_else(|| pod.metadata.annotations.as_ref().and_then(|a| a.get(NODE_ANNOTATION)).map(String::as_str))
}

fn main_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

/// When the replica's container started (or the pod, when the container does not say).
fn started(pod: &Pod) -> Option<DateTime<Utc>> {
    let state = main_container(pod).and_then(|c| c.state.as_ref());
    let container = state.and_then(|s| {
        s.running
            .as_ref()
            .and_then(|r| r.started_at.as_ref())
            .or_else(|| s.terminated.as_ref().and_then(|t| t.started_at.as_ref()))
    });
    match pod_phase(pod) {
        "Running" | "Succeeded" | "Failed" => {
            container.and_then(super::time).or_else(|| pod.status.as_ref()?.start_time.as_ref().and_then(super::time))
        }
        _ => None,
    }
}

fn finished(pod: &Pod) -> Option<DateTime<Utc>> {
    main_container(pod)?.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().and_then(super::time)
}

/// How a replica failed, and when, if it did.
fn failure(pod: &Pod, now: DateTime<Utc>) -> Option<(Outcome, Option<DateTime<Utc>>)> {
    let status = pod.status.as_ref()?;
    let container = main_container(pod);
    let condition = |kind: &str| status.conditions.as_ref()?.iter().find(|c| c.type_ == kind);
    if pod_phase(pod) == "Failed" {
        let reason = status.reason.as_deref().unwrap_or_default();
        let at = finished(pod);
        // Ended by the cluster, not by the application: the scheduler made room for a pod
        // of higher priority, or a drain, eviction or node shutdown took it.
        if let Some(disruption) = condition("DisruptionTarget").filter(|c| c.status == "True") {
            let by_scheduler = disruption.reason.as_deref().is_some_and(|r| r.starts_with("PreemptionBy"));
            return Some((if by_scheduler { Outcome::Preempted } else { Outcome::NodeLost }, at));
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return Some((Outcome::NodeLost, at));
        }
        let outcome = match reason {
            "DeadlineExceeded" => Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() },
            "Preempting" | "Preempted" => Outcome::Preempted,
            r if NODE_REASONS.contains(&r) => Outcome::NodeLost,
            r if r.starts_with("OutOf") || r == "UnexpectedAdmissionError" => Outcome::CapacityUnavailable,
            _ => {
                let terminated = container.and_then(|c| c.state.as_ref()?.terminated.as_ref());
                Outcome::AppFailed {
                    exit_code: terminated.map(|t| t.exit_code),
                    reason: terminated
                        .and_then(|t| t.reason.clone())
                        .or_else(|| status.reason.clone())
                        .unwrap_or_else(|| "Error".into()),
                }
            }
        };
        return Some((outcome, at));
    }
    if let Some(unschedulable) =
        condition("PodScheduled").filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    {
        let since = unschedulable.last_transition_time.as_ref().and_then(super::time);
        if since.is_some_and(|since| now - since >= UNSCHEDULABLE_AFTER) {
            return Some((Outcome::CapacityUnavailable, Some(now)));
        }
    }
    let waiting = container.and_then(|c| c.state.as_ref()?.waiting.as_ref())?;
    let reason = waiting.reason.as_deref()?;
    FATAL_WAITING.contains(&reason).then(|| (Outcome::AppFailed { exit_code: None, reason: reason.to_owned() }, None))
}

/// A pod log read with `timestamps=true` as lines: each starts with an RFC 3339 time and a
/// space. A read cut at `limit_bytes` may end in a partial line, which is left for the next
/// read; a line without a time (none should come) takes its predecessor's. At most `limit`.
pub fn log_lines(text: &str, limit_bytes: i64, limit: usize) -> Vec<crate::backends::LogLine> {
    let cut = usize::try_from(limit_bytes).is_ok_and(|limit| text.len() >= limit) && !text.ends_with('\n');
    let mut lines: Vec<&str> = text.lines().collect();
    if cut {
        lines.pop();
    }
    let mut last = None;
    lines
        .into_iter()
        .filter_map(|line| {
            let parsed = line
                .split_once(' ')
                .and_then(|(at, rest)| Some((DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc), rest)));
            let (at, text) = match parsed {
                Some((at, text)) => (at, text),
                None => (last?, line),
            };
            last = Some(at);
            Some(crate::backends::LogLine { at, text: text.to_owned() })
        })
        .take(limit)
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(annotations: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "fw-x-1", "annotations": annotations}})).unwrap()
    }

    fn pod(node: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {NODE_ANNOTATION: node}},
            "spec": {"containers": [{"name": "main"}], "nodeName": node},
            "status": status,
        }))
        .unwrap()
    }

    fn running(node: &str, at: &str) -> Pod {
        pod(
            node,
            json!({"phase": "Running", "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {"startedAt": at}}}]}),
        )
    }

    fn terminated(node: &str, phase: &str, code: i32, reason: &str, end: &str) -> Pod {
        pod(
            node,
            json!({"phase": phase, "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason,
                "startedAt": "2026-11-23T10:00:00Z", "finishedAt": end}}}]}),
        )
    }

    fn complete(replicas: usize) -> Service {
        service(json!({REPLICAS_ANNOTATION: replicas.to_string(), COMPLETE_ANNOTATION: "true"}))
    }

    fn now() -> DateTime<Utc> {
        "2026-11-23T12:00:00Z".parse().unwrap()
    }

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_gang_runs_only_when_every_replica_runs_and_started_with_the_last_one() {
        let svc = complete(2);
        let a = running("n1", "2026-11-23T10:00:00Z");
        let b = running("n2", "2026-11-23T10:00:05Z");
        let (phase, stop) = gang_phase(Some(&svc), &[&a, &b], &HashSet::new(), now());
        assert_eq!(phase, Phase::Running { started_at: t("2026-11-23T10:00:05Z") });
        assert!(!stop);
        let waiting = pod("n2", json!({"phase": "Pending"}));
        assert_eq!(gang_phase(Some(&svc), &[&a, &waiting], &HashSet::new(), now()).0, Phase::Pending);
        // Still being created: one pod of two, not yet complete.
        let creating = service(json!({REPLICAS_ANNOTATION: "2"}));
        assert_eq!(gang_phase(Some(&creating), &[&a], &HashSet::new(), now()).0, Phase::Pending);
    }

    #[test]
    fn a_gang_seen_by_one_of_its_pods_alone_has_not_succeeded() {
        // The Service's watch lags: only the pods are in view, and one of the two is not yet.
        let mut first = terminated("n1", "Succeeded", 0, "Completed", "2026-11-23T11:00:00Z");
        first.metadata.annotations.get_or_insert_default().insert(REPLICAS_ANNOTATION.into(), "2".into());
        assert_eq!(gang_phase(None, &[&first], &HashSet::new(), now()).0, Phase::Pending);
        let mut second = terminated("n2", "Succeeded", 0, "Completed", "2026-11-23T11:00:01Z");
        second.metadata.annotations.get_or_insert_default().insert(REPLICAS_ANNOTATION.into(), "2".into());
        let (phase, _) = gang_phase(None, &[&first, &second], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Succeeded, .. }), "{phase:?}");
    }

    #[test]
    fn the_first_failing_replica_decides_with_its_exit_code_and_reason() {
        let svc = complete(2);
        let oom = terminated("n1", "Failed", 137, "OOMKilled", "2026-11-23T11:00:00Z");
        let ok = running("n2", "2026-11-23T10:00:00Z");
        let (phase, _) = gang_phase(Some(&svc), &[&ok, &oom], &HashSet::new(), now());
        let Phase::Finished { outcome, ended_at, .. } = phase else { panic!("{phase:?}") };
        assert_eq!(outcome, Outcome::AppFailed { exit_code: Some(137), reason: "OOMKilled".into() });
        assert_eq!(ended_at, t("2026-11-23T11:00:00Z"));
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_the_gang_without_an_exit_code() {
        let svc = complete(1);
        let p = pod(
            "n1",
            json!({"phase": "Pending", "containerStatuses": [{"name": "main", "image": "i", "imageID": "",
                "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}),
        );
        let (phase, _) = gang_phase(Some(&svc), &[&p], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::AppFailed { exit_code: None, ref reason }, .. }
            if reason == "ImagePullBackOff"));
    }

    #[test]
    fn a_gang_succeeds_when_every_replica_exits_zero() {
        let svc = complete(2);
        let a = terminated("n1", "Succeeded", 0, "Completed", "2026-11-23T11:00:00Z");
        let b = terminated("n2", "Succeeded", 0, "Completed", "2026-11-23T11:00:09Z");
        let (phase, _) = gang_phase(Some(&svc), &[&a, &b], &HashSet::new(), now());
        assert_eq!(
            phase,
            Phase::Finished {
                started_at: Some(t("2026-11-23T10:00:00Z")),
                ended_at: t("2026-11-23T11:00:09Z"),
                outcome: Outcome::Succeeded
            }
        );
    }

    #[test]
    fn a_lost_node_or_a_vanished_pod_loses_the_gang() {
        let svc = complete(2);
        let a = running("n1", "2026-11-23T10:00:00Z");
        let b = running("n2", "2026-11-23T10:00:00Z");
        let lost = HashSet::from(["n2".to_owned()]);
        assert!(matches!(
            gang_phase(Some(&svc), &[&a, &b], &lost, now()).0,
            Phase::Finished { outcome: Outcome::NodeLost, .. }
        ));
        assert!(matches!(
            gang_phase(Some(&svc), &[&a], &HashSet::new(), now()).0,
            Phase::Finished { outcome: Outcome::NodeLost, .. }
        ));
    }

    #[test]
    fn evictions_deadlines_and_preemptions_map_to_their_outcomes() {
        let svc = complete(1);
        let with_reason = |reason: &str| pod("n1", json!({"phase": "Failed", "reason": reason}));
        let outcome = |p: &Pod| match gang_phase(Some(&svc), &[p], &HashSet::new(), now()).0 {
            Phase::Finished { outcome, .. } => outcome,
            other => panic!("{other:?}"),
        };
        assert_eq!(outcome(&with_reason("Evicted")), Outcome::NodeLost);
        assert_eq!(outcome(&with_reason("Preempting")), Outcome::Preempted);
        assert_eq!(outcome(&with_reason("OutOfnvidia.com/gpu")), Outcome::CapacityUnavailable);
        assert_eq!(
            outcome(&with_reason("DeadlineExceeded")),
            Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() }
        );
    }

    #[test]
    fn a_drained_or_evicted_replica_is_the_nodes_fault_and_a_scheduler_preemption_a_preemption() {
        let svc = complete(1);
        let with_condition = |reason: &str| {
            let mut p = terminated("n1", "Failed", 143, "Error", "2026-11-23T11:00:00Z");
            p.status.as_mut().unwrap().conditions = Some(vec![serde_json::from_value(
                json!({"type": "DisruptionTarget", "status": "True", "reason": reason}),
            )
            .unwrap()]);
            p
        };
        let outcome = |p: &Pod| match gang_phase(Some(&svc), &[p], &HashSet::new(), now()).0 {
            Phase::Finished { outcome, .. } => outcome,
            other => panic!("{other:?}"),
        };
        assert_eq!(outcome(&with_condition("EvictionByEvictionAPI")), Outcome::NodeLost);
        assert_eq!(outcome(&with_condition("PreemptionByScheduler")), Outcome::Preempted);
    }

    #[test]
    fn a_replica_the_scheduler_cannot_place_for_minutes_gives_its_gpus_back() {
        let svc = complete(1);
        let unschedulable = |since: &str| {
            pod(
                "n1",
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "lastTransitionTime": since}]}),
            )
        };
        let fresh = unschedulable("2026-11-23T11:59:00Z");
        assert_eq!(gang_phase(Some(&svc), &[&fresh], &HashSet::new(), now()).0, Phase::Pending);
        let stuck = unschedulable("2026-11-23T11:50:00Z");
        assert!(matches!(
            gang_phase(Some(&svc), &[&stuck], &HashSet::new(), now()).0,
            Phase::Finished { outcome: Outcome::CapacityUnavailable, .. }
        ));
    }

    #[test]
    fn a_gang_asked_to_stop_has_stopped_once_its_pods_are_gone() {
        let svc = service(json!({REPLICAS_ANNOTATION: "2", COMPLETE_ANNOTATION: "true",
            STOP_DEADLINE_ANNOTATION: "2026-11-23T11:59:30Z"}));
        let mut a = running("n1", "2026-11-23T10:00:00Z");
        // The delete did not reach the pod: the stop is asked again.
        let (phase, stop) = gang_phase(Some(&svc), &[&a], &HashSet::new(), now());
        assert!(!stop);
        assert!(matches!(phase, Phase::Pending | Phase::Running { .. }), "{phase:?}");
        a.metadata.deletion_timestamp = Some(serde_json::from_value(json!("2026-11-23T11:59:30Z")).unwrap());
        let (phase, stop) = gang_phase(Some(&svc), &[&a], &HashSet::new(), now());
        assert!(stop);
        assert!(matches!(phase, Phase::Pending | Phase::Running { .. }), "{phase:?}");
        // SIGTERM's exit code is how a stop ends, not a failure.
        let sigterm = terminated("n1", "Failed", 143, "Error", "2026-11-23T11:59:40Z");
        let (phase, _) = gang_phase(Some(&svc), &[&sigterm], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{phase:?}");
        // A pod on a dead node never confirms: stopped all the same.
        let lost = HashSet::from(["n1".to_owned()]);
        let (phase, _) = gang_phase(Some(&svc), &[&a], &lost, now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{phase:?}");
        let (phase, stop) = gang_phase(Some(&svc), &[], &HashSet::new(), now());
        assert!(stop);
        assert_eq!(
            phase,
            Phase::Finished { started_at: None, ended_at: t("2026-11-23T11:59:30Z"), outcome: Outcome::Stopped }
        );
    }

    #[test]
    fn a_gang_that_exited_0_after_the_stop_was_asked_stopped_and_one_that_exited_before_succeeded() {
        let svc = service(json!({REPLICAS_ANNOTATION: "1", COMPLETE_ANNOTATION: "true",
            STOP_DEADLINE_ANNOTATION: "2026-11-23T11:59:30Z", STOP_ASKED_ANNOTATION: "2026-11-23T11:59:00Z"}));
        // A checkpointing application answers SIGTERM with exit 0: it has work left.
        let answered = terminated("n1", "Succeeded", 0, "Completed", "2026-11-23T11:59:05Z");
        let (phase, _) = gang_phase(Some(&svc), &[&answered], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{phase:?}");
        // Its run was over before the stop was asked: its own success.
        let finished = terminated("n1", "Succeeded", 0, "Completed", "2026-11-23T11:58:00Z");
        let (phase, _) = gang_phase(Some(&svc), &[&finished], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Succeeded, .. }), "{phase:?}");
        // Within the margin for the kubelet's clock, and without the instant of the ask, it
        // counts as stopped.
        let close = terminated("n1", "Succeeded", 0, "Completed", "2026-11-23T11:58:59.500Z");
        let (phase, _) = gang_phase(Some(&svc), &[&close], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{phase:?}");
        let older = service(json!({REPLICAS_ANNOTATION: "1", COMPLETE_ANNOTATION: "true",
            STOP_DEADLINE_ANNOTATION: "2026-11-23T11:59:30Z"}));
        let (phase, _) = gang_phase(Some(&older), &[&finished], &HashSet::new(), now());
        assert!(matches!(phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{phase:?}");
    }

    #[test]
    fn a_timestamped_pod_log_becomes_lines_with_their_times() {
        let text = "2026-11-25T10:00:00.123456789Z step 1\n2026-11-25T10:00:01Z step 2 \n2026-11-25T10:00:02.5Z ";
        let lines = log_lines(text, 1 << 20, 100);
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["step 1", "step 2 ", ""]);
        assert_eq!(lines[0].at.timestamp_subsec_nanos(), 123_456_789);
        assert_eq!(lines[2].at.to_rfc3339(), "2026-11-25T10:00:02.500+00:00");
    }

    #[test]
    fn a_read_cut_at_its_byte_limit_leaves_the_partial_line_for_the_next() {
        let text = "2026-11-25T10:00:00Z whole\n2026-11-25T10:00:01Z par";
        let lines = log_lines(text, text.len() as i64, 100);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].text, "whole");
        assert_eq!(log_lines(text, 1 << 20, 100).len(), 2, "an uncut read keeps its last line");
        assert_eq!(log_lines(text, 1 << 20, 1).len(), 1, "at most the limit");
    }

    #[test]
    fn a_line_without_a_time_takes_its_predecessors() {
        let lines = log_lines("no time first\n2026-11-25T10:00:00Z a\ncontinued", 1 << 20, 100);
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["a", "continued"]);
        assert_eq!(lines[1].at, lines[0].at);
    }
}
