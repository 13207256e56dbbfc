//! Job arrays from the client: `submit --array N[%P]`, and `fairway array status | tasks |
//! cancel | wait`. A wait polls the array (its tasks' events would be thousands of streams),
//! printing its counts whenever they change, and ends with one exit status for the array.

use std::time::Duration;

use serde_json::Value;
use tokio::time::{sleep, timeout, Instant};

use super::{
    exit::{Exit, Finish},
    http::{Api, Error, Repeat},
    output,
    wait::{Interrupt, Options, Signals},
};

/// How often a wait reads the array.
const POLL: Duration = Duration::from_secs(1);
/// How long a wait keeps watching a cancelled array end.
const CANCEL_GRACE: Duration = Duration::from_secs(60);

/// `N` or `N%P`: a task count and, after `%` as in Slurm's `--array`, how many may run at once.
pub fn shape(text: &str) -> Result<(u32, Option<u32>), String> {
    let number = |s: &str, what: &str| {
        s.trim().parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| format!("`{s}` is not a positive {what}"))
    };
    match text.split_once('%') {
        Some((count, parallelism)) => Ok((number(count, "task count")?, Some(number(parallelism, "parallelism")?))),
        None => Ok((number(text, "task count")?, None)),
    }
}

/// One line for an array: its state and its counts, the ones that are not zero.
pub fn summary(array: &Value) -> String {
    let counts = array.get("counts").cloned().unwrap_or(Value::Null);
    let parts: Vec<String> =
        ["pending", "held", "admitted", "running", "stopping", "succeeded", "failed", "cancelled", "preempted"]
            .iter()
            .filter_map(|k| counts.get(*k).and_then(Value::as_i64).filter(|n| *n > 0).map(|n| format!("{n} {k}")))
            .collect();
    format!(
        "array {} ({} tasks{}): {}{}{}",
        output::field(array, "id"),
        output::field(array, "count"),
        array.get("parallelism").and_then(Value::as_i64).map(|p| format!(", at most {p} at once")).unwrap_or_default(),
        output::field(array, "state"),
        if parts.is_empty() { "" } else { "; " },
        parts.join(", ")
    )
}

/// What a wait for an array ended with.
pub struct Ended {
    pub finish: Finish,
    /// The array as last read, when the wait saw its end.
    pub array: Option<Value>,
}

/// Follows array `id` of `team` to its end, printing its counts to standard error when they
/// change. A first signal cancels the array (unless `--detach`) and keeps watching it end.
pub async fn wait(api: &Api, team: &str, id: &str, options: Options, signals: &mut Signals) -> Result<Ended, Error> {
    let url = api.url(&["teams", team, "arrays", id]);
    let deadline = options.timeout.map(|t| Instant::now() + t);
    let mut interrupted: Option<(Interrupt, Instant)> = None;
    let mut last_line = String::new();
    loop {
        let array = api.get(url.clone()).await?;
        let line = summary(&array);
        if line != last_line {
            eprintln!("{line}");
            last_line = line;
        }
        let state = output::field(&array, "state");
        if !matches!(state.as_str(), "pending" | "running") {
            let finish = match interrupted {
                Some((signal, _)) => signal.exit().into(),
                None => outcome(api, team, id, &array).await?,
            };
            return Ok(Ended { finish, array: Some(array) });
        }
        let until = interrupted.map(|(_, by)| by).or(deadline);
        tokio::select! {
            () = sleep(POLL) => {}
            signal = signals.recv() => {
                if let Some((first, _)) = interrupted {
                    eprintln!("fairway: {signal} again: not waiting for array {id} to end");
                    return Ok(Ended { finish: first.exit().into(), array: None });
                }
                if options.detach {
                    eprintln!("fairway: {signal}: array {id} goes on (--detach)");
                    return Ok(Ended { finish: signal.exit().into(), array: None });
                }
                eprintln!("fairway: {signal}: cancelling array {id}");
                let cancel = api.post(api.url(&["teams", team, "arrays", id, "cancel"]), None, None, Repeat::Safe);
                match timeout(CANCEL_GRACE, cancel).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => eprintln!("{}", error.report()),
                    Err(_) => eprintln!("fairway: the server did not answer the cancellation in time"),
                }
                interrupted = Some((signal, Instant::now() + CANCEL_GRACE));
            }
            () = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {
                if let Some((signal, _)) = interrupted {
                    eprintln!("fairway: array {id} did not end within {}s of its cancellation", CANCEL_GRACE.as_secs());
                    return Ok(Ended { finish: signal.exit().into(), array: None });
                }
                let after = options.timeout.map_or(0, |t| t.as_secs());
                eprintln!("fairway: --timeout of {after}s elapsed; array {id} goes on (fairway array status {id})");
                return Ok(Ended { finish: Exit::TimedOut.into(), array: None });
            }
        }
    }
}

/// The exit status an ended array means: 0 when every task succeeded, 125 when it was
/// cancelled; when a task failed, the exit code of the lowest-indexed failed task when it
/// has one, else 127; 126 when the only failures are tasks preempted beyond their retries.
async fn outcome(api: &Api, team: &str, id: &str, array: &Value) -> Result<Finish, Error> {
    let count = |k: &str| array.get("counts").and_then(|c| c.get(k)).and_then(Value::as_i64).unwrap_or(0);
    match output::field(array, "state").as_str() {
        "succeeded" => Ok(Exit::Success.into()),
        "cancelled" => Ok(Exit::Cancelled.into()),
        "failed" => {
            if count("failed") > 0 {
                let mut url = api.url(&["teams", team, "arrays", id, "tasks"]);
                url.query_pairs_mut().append_pair("state", "failed").append_pair("limit", "1");
                let page = api.get(url).await?;
                let code = page["items"][0].get("exit_code").and_then(Value::as_i64);
                if let Some(code) = code.and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0) {
                    return Ok(Finish::Job(code));
                }
                return Ok(Exit::FailedWithoutCode.into());
            }
            Ok(Exit::Preempted.into())
        }
        _ => Ok(Exit::Unavailable.into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_array_shape_is_a_count_and_an_optional_parallelism_after_a_percent_sign() {
        assert_eq!(shape("1000"), Ok((1000, None)));
        assert_eq!(shape("1000%50"), Ok((1000, Some(50))));
        assert!(shape("0").unwrap_err().contains("task count"));
        assert!(shape("10%0").unwrap_err().contains("parallelism"));
        assert!(shape("0-99").is_err(), "indices always run from 0: a range is not a count");
    }

    #[test]
    fn the_summary_names_the_state_and_only_the_counts_that_are_not_zero() {
        let array = json!({"id": "a1", "count": 10, "parallelism": 2, "state": "running",
                           "counts": {"pending": 6, "held": 6, "running": 2, "succeeded": 2, "failed": 0}});
        assert_eq!(
            summary(&array),
            "array a1 (10 tasks, at most 2 at once): running; 6 pending, 6 held, 2 running, 2 succeeded"
        );
    }
}
