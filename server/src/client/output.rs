//! Text for people: aligned columns, one line per event, a job's state in a few lines. The
//! client reads the server's JSON loosely here (a field it does not know is skipped, one that
//! is missing prints as `-`), so a newer server never breaks an older client's text.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::duration;

/// Columns aligned with two spaces between them; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A field as text: strings bare, numbers as written, absent or null as `-`.
pub fn field(value: &Value, key: &str) -> String {
    match value.get(key) {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn time(value: &Value, key: &str) -> Option<DateTime<Utc>> {
    value.get(key)?.as_str()?.parse().ok()
}

/// When, relative to `now`: `in 12m`, `3m ago`, `now`.
pub fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (at - now).num_seconds();
    match seconds {
        -4..=4 => "now".to_owned(),
        s if s > 0 => format!("in {}", duration::human(s)),
        s => format!("{} ago", duration::human(s)),
    }
}

/// An expected start with its interval: `in 12m (between 5m and 40m)`.
pub fn expected_start(value: &Value, now: DateTime<Utc>) -> Option<String> {
    let expected = relative(time(value, "expected_start_at")?, now);
    match (time(value, "earliest_start_at"), time(value, "latest_start_at")) {
        (Some(early), Some(late)) => {
            let bound = |t: DateTime<Utc>| match relative(t, now).strip_prefix("in ") {
                Some(ahead) => ahead.to_owned(),
                None => "now".to_owned(),
            };
            Some(format!("{expected} (between {} and {})", bound(early), bound(late)))
        }
        _ => Some(expected),
    }
}

/// One line of a job's timeline: time of day (UTC), kind, and the server's sentence.
pub fn event_line(event: &Value) -> String {
    let at = time(event, "at").map_or_else(|| "--:--:--".to_owned(), |t| t.format("%H:%M:%S").to_string());
    let kind = field(event, "kind");
    let message = match event.get("message").and_then(Value::as_str).filter(|m| !m.is_empty()) {
        Some(message) => message.to_owned(),
        None => field(event, "reason"),
    };
    let attempt = event.get("attempt").and_then(Value::as_i64).filter(|a| *a > 1);
    match attempt {
        Some(a) => format!("{at}  {kind:<10} {message} (attempt {a})"),
        None => format!("{at}  {kind:<10} {message}"),
    }
}

/// A job in a few lines: what it is, its state, and why it waits or how it ended.
pub fn job(job: &Value, now: DateTime<Utc>) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("job", field(job, "id")),
        ("name", field(job, "name")),
        ("team", field(job, "team")),
        ("state", field(job, "state")),
    ];
    let gpus = match (job.get("replicas").and_then(Value::as_i64), job.get("gpus_per_replica").and_then(Value::as_i64))
    {
        (Some(r), Some(g)) if r > 1 => format!("{r} × {g} {}", field(job, "gpu_class")),
        (_, Some(g)) => format!("{g} {}", field(job, "gpu_class")),
        _ => field(job, "gpu_class"),
    };
    rows.push(("gpus", gpus));
    // One row per job it waits for: what for, the job, its state now.
    for d in job.get("depends_on").and_then(Value::as_array).into_iter().flatten() {
        rows.push((
            "after",
            format!("{} {} ({}), {}", field(d, "after"), field(d, "name"), field(d, "job"), field(d, "state")),
        ));
    }
    if let Some(pending) = job.get("pending").filter(|p| p.is_object()) {
        let reason = field(pending, "reason");
        match pending.get("message").and_then(Value::as_str) {
            Some(message) => rows.push(("waiting", format!("{reason}: {message}"))),
            None => rows.push(("waiting", reason)),
        }
        if pending.get("position").is_some_and(|p| !p.is_null()) {
            rows.push(("position", field(pending, "position")));
        }
        if let Some(start) = expected_start(pending, now) {
            rows.push(("expected", start));
        }
    }
    if job.get("cluster").is_some_and(|c| !c.is_null()) {
        rows.push(("cluster", field(job, "cluster")));
    }
    if job.get("attempt").and_then(Value::as_i64).is_some_and(|a| a > 0) {
        rows.push(("attempt", field(job, "attempt")));
    }
    if let Some(started) = time(job, "started_at") {
        rows.push(("started", relative(started, now)));
    }
    if let Some(finished) = time(job, "finished_at") {
        rows.push(("finished", relative(finished, now)));
    }
    if job.get("exit_code").is_some_and(|c| !c.is_null()) {
        rows.push(("exit code", field(job, "exit_code")));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

/// The jobs of a list, one a row.
pub fn jobs(items: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|j| {
            let gpus =
                match (j.get("replicas").and_then(Value::as_i64), j.get("gpus_per_replica").and_then(Value::as_i64)) {
                    (Some(r), Some(g)) => (r * g).to_string(),
                    _ => "-".to_owned(),
                };
            let submitted = time(j, "submitted_at").map_or_else(|| "-".to_owned(), |t| relative(t, now));
            vec![field(j, "id"), field(j, "state"), field(j, "gpu_class"), gpus, submitted, field(j, "name")]
        })
        .collect();
    table(&["ID", "STATE", "CLASS", "GPUS", "SUBMITTED", "NAME"], &rows)
}

/// The team's job templates, one line each: what a job from it asks for.
pub fn templates(items: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            let spec = t.get("spec").cloned().unwrap_or(Value::Null);
            let number = |key: &str| spec.get(key).and_then(Value::as_i64).unwrap_or(1);
            let gpus = (number("replicas") * number("gpus_per_replica")).to_string();
            let updated = time(t, "updated_at").map_or_else(|| "-".to_owned(), |at| relative(at, now));
            vec![
                field(t, "name"),
                field(&spec, "gpu_class"),
                gpus,
                field(t, "updated_by"),
                updated,
                field(&spec, "image"),
            ]
        })
        .collect();
    table(&["NAME", "CLASS", "GPUS", "UPDATED BY", "UPDATED", "IMAGE"], &rows)
}

/// The team's queue, in admission order.
pub fn queue(entries: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let expected = time(e, "expected_start_at").map_or_else(|| "-".to_owned(), |t| relative(t, now));
            vec![
                field(e, "position"),
                field(e, "id"),
                field(e, "gpu_class"),
                field(e, "gpus"),
                expected,
                field(e, "reason"),
                field(e, "name"),
            ]
        })
        .collect();
    table(&["POS", "ID", "CLASS", "GPUS", "EXPECTED", "REASON", "NAME"], &rows)
}

/// What the scheduler would do with a job submitted now.
pub fn dry_run(result: &Value, now: DateTime<Utc>) -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
    if result.get("fits_now").and_then(Value::as_bool) == Some(true) {
        rows.push(("fits", format!("now, on {}", field(result, "cluster"))));
    } else {
        let reason = field(result, "reason");
        let why = match result.get("message").and_then(Value::as_str) {
            Some(message) => format!("{reason}: {message}"),
            None => reason,
        };
        rows.push(("would wait", why));
        if result.get("position").is_some_and(|p| !p.is_null()) {
            rows.push(("position", field(result, "position")));
        }
        if let Some(start) = expected_start(result, now) {
            rows.push(("expected", start));
        } else if let Some(why) = result.get("start_unforeseeable_message").and_then(Value::as_str) {
            rows.push(("expected", format!("unforeseeable: {why}")));
        }
    }
    let victims = result.get("would_preempt").and_then(Value::as_array).cloned().unwrap_or_default();
    if !victims.is_empty() {
        let named: Vec<String> = victims
            .iter()
            .map(|v| {
                let job = v.get("job").and_then(Value::as_str).map(|j| format!(" {j}")).unwrap_or_default();
                format!("{}{job} ({} GPUs, {})", field(v, "team"), field(v, "gpus"), field(v, "reason"))
            })
            .collect();
        rows.push(("would preempt", named.join("; ")));
    }
    let extras = result.get("would_take_extras").and_then(Value::as_array).cloned().unwrap_or_default();
    if !extras.is_empty() {
        let named: Vec<String> = extras
            .iter()
            .map(|w| {
                let gang = w.get("gang").and_then(Value::as_str).map(|g| format!(" {g}")).unwrap_or_default();
                format!(
                    "{} extras of {}{gang} ({} GPUs, {})",
                    field(w, "replicas"),
                    field(w, "team"),
                    field(w, "gpus"),
                    field(w, "reason")
                )
            })
            .collect();
        rows.push(("would take extras", named.join("; ")));
    }
    if let Some(micros) = result.get("max_cost_micros").and_then(Value::as_i64) {
        let cents = (micros + 5_000) / 10_000;
        rows.push(("max cost", format!("{}.{:02} {}", cents / 100, cents % 100, field(result, "currency"))));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-05-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn columns_align_and_the_last_is_not_padded() {
        let rows = vec![
            vec!["a".to_owned(), "long cell".to_owned(), "x".to_owned()],
            vec!["bbb".to_owned(), "c".to_owned(), "yy".to_owned()],
        ];
        assert_eq!(table(&["H1", "H2", "H3"], &rows), "H1   H2         H3\na    long cell  x\nbbb  c          yy\n");
    }

    #[test]
    fn a_waiting_job_says_why_where_it_stands_and_when_it_should_start() {
        let text = job(
            &json!({
                "id": "j1", "name": "train", "team": "vision", "state": "pending", "gpu_class": "h100-80gb",
                "replicas": 2, "gpus_per_replica": 8, "attempt": 0,
                "pending": {"reason": "quota", "message": "the team uses 16 of 16 GPUs", "position": 3,
                            "expected_start_at": "2026-05-01T12:12:00Z", "earliest_start_at": "2026-05-01T12:05:00Z",
                            "latest_start_at": "2026-05-01T12:40:00Z"}
            }),
            now(),
        );
        assert_eq!(
            text,
            "job       j1\nname      train\nteam      vision\nstate     pending\ngpus      2 × 8 h100-80gb\n\
             waiting   quota: the team uses 16 of 16 GPUs\nposition  3\nexpected  in 12m (between 5m and 40m)\n"
        );
    }

    #[test]
    fn a_job_waiting_for_others_names_each_with_what_it_waits_for_and_its_state() {
        let text = job(
            &json!({
                "id": "j2", "name": "evaluate", "team": "vision", "state": "pending", "gpu_class": "h100-80gb",
                "gpus_per_replica": 1, "attempt": 0,
                "depends_on": [{"job": "j1", "name": "train", "after": "succeeded", "state": "running"}],
                "pending": {"reason": "waiting_for_dependencies", "message": "waiting for job train (j1), running"}
            }),
            now(),
        );
        assert_eq!(
            text,
            "job      j2\nname     evaluate\nteam     vision\nstate    pending\ngpus     1 h100-80gb\n\
             after    succeeded train (j1), running\n\
             waiting  waiting_for_dependencies: waiting for job train (j1), running\n"
        );
    }

    #[test]
    fn a_finished_job_shows_its_exit_code() {
        let text = job(
            &json!({"id": "j", "state": "failed", "exit_code": 3, "attempt": 1, "finished_at": "2026-05-01T11:58:00Z"}),
            now(),
        );
        assert!(text.contains("state      failed\n"), "{text}");
        assert!(text.contains("exit code  3\n"), "{text}");
        assert!(text.contains("finished   2m ago\n"), "{text}");
    }

    #[test]
    fn an_event_is_one_line_with_time_kind_and_sentence() {
        let line = event_line(
            &json!({"id": 4, "at": "2026-05-01T12:00:07.5Z", "kind": "failed", "attempt": 1, "message": "exited with code 3"}),
        );
        assert_eq!(line, "12:00:07  failed     exited with code 3");
        let retried = event_line(
            &json!({"at": "2026-05-01T12:00:07Z", "kind": "running", "attempt": 2, "message": "", "reason": "started"}),
        );
        assert_eq!(retried, "12:00:07  running    started (attempt 2)");
    }

    #[test]
    fn a_dry_run_names_its_victims_and_its_cost() {
        let text = dry_run(
            &json!({"fits_now": true, "cluster": "sim", "would_preempt": [{"team": "a", "gpus": 4, "reason": "priority", "job": null}],
                    "max_cost_micros": 12_345_678, "currency": "USD"}),
            now(),
        );
        assert_eq!(text, "fits           now, on sim\nwould preempt  a (4 GPUs, priority)\nmax cost       12.35 USD\n");
    }

    #[test]
    fn a_dry_run_names_the_elastic_gangs_that_would_give_extras_back() {
        let text = dry_run(
            &json!({"fits_now": false, "reason": "waiting_for_reclaim", "message": "waits",
                    "would_take_extras": [{"team": "research", "gang": "g1", "reason": "own_team", "replicas": 3, "gpus": 3},
                                          {"team": "b", "gang": null, "reason": "reclaim", "replicas": 1, "gpus": 8}]}),
            now(),
        );
        assert!(
            text.contains(
                "would take extras  3 extras of research g1 (3 GPUs, own_team); 1 extras of b (8 GPUs, reclaim)\n"
            ),
            "{text}"
        );
    }
}
