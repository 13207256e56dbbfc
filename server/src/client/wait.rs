//! Waiting for a job to end, as a CI step does: its events streamed to standard error as
//! they happen, the outcome turned into the exit status, and a CI cancellation (SIGINT or
//! SIGTERM to the step) passed on to the job.
//!
//! The events come from `GET /jobs/{id}/events:stream`, a server-sent event stream that ends
//! with an `end` frame holding the finished job. A task follows it and hands the main loop
//! what it reads, so the loop can answer a signal or a deadline at any moment; a dropped
//! connection is resumed after the last event id seen. A server without the stream (older
//! than this client) is polled instead.

use std::{collections::VecDeque, fmt, time::Duration};

use futures_util::FutureExt as _;
use reqwest::{header, Method, StatusCode};
use serde_json::Value;
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::mpsc,
    time::{sleep, sleep_until, timeout, Instant},
};

use super::{
    exit::{Exit, Finish},
    http::{Api, Error, Repeat},
    output,
    sse::Parser,
};

/// How long a cancelled job has to end before the client exits anyway: CI systems kill a
/// step some seconds after they signal it, and a stuck server must not hold the step.
const CANCEL_GRACE: Duration = Duration::from_secs(60);
/// A stream silent for this long is taken for a dead connection (the server sends a
/// keepalive comment much more often).
const IDLE: Duration = Duration::from_secs(75);
/// How long the server may stay out of reach before the wait gives up (exit 69). A rolling
/// restart takes seconds; this covers a failover too.
const MAX_OUTAGE: Duration = Duration::from_secs(300);
/// How often an older server without the stream is asked.
const POLL_EVERY: Duration = Duration::from_secs(2);
/// Lines of the last attempt's log shown after the job ends.
const LOG_TAIL_LINES: usize = 50;

/// How long the end of the job waits for its log's last lines to be printed: the server
/// keeps them before it records the end, so they are normally there at once.
const LOG_DRAIN: Duration = Duration::from_secs(10);

/// What a wait may end on besides the job's end, and what it shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Stop waiting after this long (exit 124), leaving the job running.
    pub timeout: Option<Duration>,
    /// On SIGINT/SIGTERM, leave the job alone instead of cancelling it.
    pub detach: bool,
    /// What of the job's log to show.
    pub logs: Logs,
}

/// What of the job's log a wait shows on standard error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Logs {
    /// Each attempt's lines as they are written, from its start.
    #[default]
    Follow,
    /// The last lines of the last attempt, once the job ended.
    Tail,
    /// None.
    None,
}

/// The signal that interrupted a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Ctrl-C, or a CI system's first word.
    Int,
    /// What CI systems send a step they cancel.
    Term,
}

impl Interrupt {
    /// The exit status it ends the client with: 128 + the signal.
    pub fn exit(self) -> Exit {
        match self {
            Interrupt::Int => Exit::Interrupted,
            Interrupt::Term => Exit::Terminated,
        }
    }
}

impl fmt::Display for Interrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
        })
    }
}

/// SIGINT and SIGTERM, caught. Installed before a job is submitted, so that a step cancelled
/// during the submission still cancels the job it made.
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    /// Catches SIGINT and SIGTERM from now on.
    pub fn install() -> Result<Self, Error> {
        let catch = |kind| signal(kind).map_err(|e| Error::Unavailable(format!("cannot catch signals: {e}")));
        Ok(Self { int: catch(SignalKind::interrupt())?, term: catch(SignalKind::terminate())? })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Int,
            _ = self.term.recv() => Interrupt::Term,
        }
    }

    /// A signal that already arrived, if any.
    pub fn arrived(&mut self) -> Option<Interrupt> {
        self.recv().now_or_never()
    }
}

/// How a wait ended.
#[derive(Debug)]
pub struct Ended {
    /// The exit status.
    pub finish: Finish,
    /// The job as last seen, when the wait saw its end.
    pub job: Option<Value>,
}

/// What the follower hands the main loop.
enum Item {
    Event(Value),
    End(Value),
    Failed(Error),
}

/// Ends the follower when the wait returns, whichever way.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for `job` to end, printing its events to standard error, and says how to exit.
pub async fn wait(api: &Api, job: &str, options: Options, signals: &mut Signals) -> Result<Ended, Error> {
    let (tx, mut rx) = mpsc::channel(256);
    let _follower = AbortOnDrop(tokio::spawn(follow(api.clone(), job.to_owned(), tx)));
    let deadline = options.timeout.map(|t| Instant::now() + t);
    // Set once a signal arrived and the job was asked to stop: which signal, and until when
    // the client keeps following the job's end.
    let mut interrupted: Option<(Interrupt, Instant)> = None;
    if let Some(signal) = signals.arrived() {
        if let Some(ended) = on_signal(api, job, options, signal, &mut interrupted).await {
            return Ok(ended);
        }
    }
    // The attempts whose logs are being streamed, the newest last.
    let mut streams: Vec<(i64, tokio::task::JoinHandle<Streamed>)> = Vec::new();
    loop {
        let until = interrupted.map(|(_, by)| by).or(deadline);
        tokio::select! {
            item = rx.recv() => match item {
                Some(Item::Event(event)) => {
                    eprintln!("{}", output::event_line(&event));
                    let attempt = event.get("attempt").and_then(Value::as_i64).unwrap_or(0);
                    let running = event.get("kind").and_then(Value::as_str) == Some("running");
                    if options.logs == Logs::Follow && running && !streams.iter().any(|(a, _)| *a == attempt) {
                        streams.push((attempt, tokio::spawn(stream_log(api.clone(), job.to_owned(), attempt))));
                    }
                }
                Some(Item::End(last)) => {
                    // The log's last lines before the outcome: they say why.
                    let mut streamed = Streamed::Broken;
                    for (attempt, stream) in streams.drain(..) {
                        let done = timeout(LOG_DRAIN, stream).await.ok().and_then(Result::ok);
                        if Some(attempt) == last.get("attempt").and_then(Value::as_i64) {
                            streamed = done.unwrap_or(Streamed::Broken);
                        }
                    }
                    eprintln!("{}", summary(job, &last));
                    let finish = match interrupted {
                        Some((signal, _)) => signal.exit().into(),
                        None => outcome(&last),
                    };
                    if interrupted.is_none() && options.logs != Logs::None && streamed != Streamed::Whole {
                        log_tail(api, job, &last).await;
                    }
                    return Ok(Ended { finish, job: Some(last) });
                }
                Some(Item::Failed(error)) => match interrupted {
                    Some((signal, _)) => {
                        eprintln!("{}", error.report());
                        return Ok(Ended { finish: signal.exit().into(), job: None });
                    }
                    None => return Err(error),
                },
                None => return Err(Error::Unavailable("the job's event stream stopped".to_owned())),
            },
            signal = signals.recv() => {
                if let Some(ended) = on_signal(api, job, options, signal, &mut interrupted).await {
                    return Ok(ended);
                }
            }
            () = sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {
                if let Some((signal, _)) = interrupted {
                    eprintln!("fairway: job {job} did not end within {}s of its cancellation", CANCEL_GRACE.as_secs());
                    return Ok(Ended { finish: signal.exit().into(), job: None });
                }
                let after = options.timeout.map_or(0, |t| t.as_secs());
                eprintln!("fairway: --timeout of {after}s elapsed; job {job} goes on (fairway status {job})");
                return Ok(Ended { finish: Exit::TimedOut.into(), job: None });
            }
        }
    }
}

/// Answers a signal: the first cancels the job (unless detached) and keeps following it; a
/// second, or any with `--detach`, ends the wait at once.
async fn on_signal(
    api: &Api,
    job: &str,
    options: Options,
    signal: Interrupt,
    interrupted: &mut Option<(Interrupt, Instant)>,
) -> Option<Ended> {
    if let Some((first, _)) = interrupted {
        eprintln!("fairway: {signal} again: not waiting for job {job} to end");
        return Some(Ended { finish: first.exit().into(), job: None });
    }
    if options.detach {
        eprintln!("fairway: {signal}: job {job} goes on (--detach)");
        return Some(Ended { finish: signal.exit().into(), job: None });
    }
    eprintln!("fairway: {signal}: cancelling job {job}");
    let cancel = api.post(api.url(&["jobs", job, "cancel"]), None, None, Repeat::Safe);
    match timeout(CANCEL_GRACE, cancel).await {
        Ok(Ok(_)) => {}
        // 409: it ended meanwhile; its end frame is on its way.
        Ok(Err(Error::Refused { status: StatusCode::CONFLICT, .. })) => {}
        Ok(Err(error)) => eprintln!("{}", error.report()),
        Err(_) => eprintln!("fairway: the server did not answer the cancellation in time"),
    }
    *interrupted = Some((signal, Instant::now() + CANCEL_GRACE));
    None
}

/// The exit status a finished job means. The job's own exit code wins when it failed with
/// one, even where it is a number the client also uses.
pub fn outcome(job: &Value) -> Finish {
    let code = job.get("exit_code").and_then(Value::as_i64);
    match job.get("state").and_then(Value::as_str).unwrap_or_default() {
        "succeeded" => Exit::Success.into(),
        "failed" => match code.and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0) {
            Some(code) => Finish::Job(code),
            None => Exit::FailedWithoutCode.into(),
        },
        "cancelled" => Exit::Cancelled.into(),
        "preempted" => Exit::Preempted.into(),
        // The stream ends only on a final state; anything else is a server this client
        // does not understand.
        _ => Exit::Unavailable.into(),
    }
}

/// Whether a job will change no more: a preempted job is final only once it finished (it
/// may otherwise be requeued).
fn is_final(job: &Value) -> bool {
    match job.get("state").and_then(Value::as_str) {
        Some("succeeded" | "failed" | "cancelled") => true,
        Some("preempted") => job.get("finished_at").is_some_and(|f| !f.is_null()),
        _ => false,
    }
}

/// The closing line: how the job ended.
fn summary(id: &str, job: &Value) -> String {
    let state = output::field(job, "state");
    match job.get("exit_code").and_then(Value::as_i64) {
        Some(code) if state == "failed" => format!("job {id} failed with exit code {code}"),
        _ => format!("job {id} {state}"),
    }
}

/// Follows the job's event stream, reconnecting after the last event seen, until its end.
async fn follow(api: Api, job: String, tx: mpsc::Sender<Item>) {
    let mut after: i64 = 0;
    let mut delay = Duration::from_millis(250);
    let mut unreachable_since: Option<Instant> = None;
    loop {
        let mut url = api.url(&["jobs", &job, "events:stream"]);
        url.query_pairs_mut().append_pair("after", &after.to_string());
        let opened = api
            .send(
                || {
                    api.request(Method::GET, url.clone())
                        .header(header::ACCEPT, "text/event-stream")
                        .header("last-event-id", after.to_string())
                },
                Repeat::Safe,
            )
            .await;
        match opened {
            Ok(mut response) => {
                unreachable_since = None;
                let mut parser = Parser::default();
                // Read until the connection breaks, goes quiet, or the end frame comes.
                while let Ok(Ok(Some(bytes))) = timeout(IDLE, response.chunk()).await {
                    delay = Duration::from_millis(250);
                    for frame in parser.push(&bytes) {
                        let Ok(data) = serde_json::from_str::<Value>(&frame.data) else { continue };
                        match frame.event.as_str() {
                            "job_event" => {
                                let id = frame.id.as_deref().and_then(|i| i.parse().ok());
                                if let Some(id) = id.or_else(|| data.get("id").and_then(Value::as_i64)) {
                                    after = after.max(id);
                                }
                                if tx.send(Item::Event(data)).await.is_err() {
                                    return;
                                }
                            }
                            "end" => {
                                let _ = tx.send(Item::End(data)).await;
                                return;
                            }
                            // A frame this client does not know is some newer server's.
                            _ => {}
                        }
                    }
                }
            }
            // No stream here: no such job, or a server older than this client, which is
            // asked every few seconds instead.
            Err(e) if e.is_not_found() => {
                if let Err(error) = api.get(api.url(&["jobs", &job])).await {
                    let _ = tx.send(Item::Failed(error)).await;
                    return;
                }
                eprintln!("fairway: the server has no event stream; asking every {}s instead", POLL_EVERY.as_secs());
                return poll(&api, &job, after, &tx).await;
            }
            Err(Error::Unavailable(message)) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > MAX_OUTAGE {
                    let message =
                        format!("{message}; gave up after {}s (job {job} may still run)", MAX_OUTAGE.as_secs());
                    let _ = tx.send(Item::Failed(Error::Unavailable(message))).await;
                    return;
                }
            }
            Err(error) => {
                let _ = tx.send(Item::Failed(error)).await;
                return;
            }
        }
        sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Reads the job and its new events every few seconds until it is final.
async fn poll(api: &Api, job: &str, mut after: i64, tx: &mpsc::Sender<Item>) {
    let mut unreachable_since: Option<Instant> = None;
    loop {
        match poll_once(api, job, &mut after, tx).await {
            Ok(Some(last)) => {
                let _ = tx.send(Item::End(last)).await;
                return;
            }
            Ok(None) => unreachable_since = None,
            Err(Error::Unavailable(message)) => {
                let since = *unreachable_since.get_or_insert_with(Instant::now);
                if since.elapsed() > MAX_OUTAGE {
                    let _ = tx.send(Item::Failed(Error::Unavailable(message))).await;
                    return;
                }
            }
            Err(error) => {
                let _ = tx.send(Item::Failed(error)).await;
                return;
            }
        }
        sleep(POLL_EVERY).await;
    }
}

/// One look: the job, then every event after `after`; the job when it is final. The job is
/// read first, so that the events of a final job are all there when they are read.
async fn poll_once(api: &Api, job: &str, after: &mut i64, tx: &mpsc::Sender<Item>) -> Result<Option<Value>, Error> {
    let current = api.get(api.url(&["jobs", job])).await?;
    loop {
        let mut url = api.url(&["jobs", job, "events"]);
        url.query_pairs_mut().append_pair("after", &after.to_string());
        let events = api.get(url).await?;
        let events = events.as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            break;
        }
        for event in events {
            let Some(id) = event.get("id").and_then(Value::as_i64) else { continue };
            *after = (*after).max(id);
            if tx.send(Item::Event(event)).await.is_err() {
                return Ok(None);
            }
        }
    }
    Ok(is_final(&current).then_some(current))
}

/// How streaming an attempt's log ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streamed {
    /// To the attempt's end, with at least one line.
    Whole,
    /// Cut short, refused (a server without logs) or empty: the tail is worth showing.
    Broken,
}

/// Streams one attempt's log to standard error as it is written, until the attempt is over.
async fn stream_log(api: Api, job: String, attempt: i64) -> Streamed {
    let mut url = api.url(&["jobs", &job, "logs"]);
    url.query_pairs_mut().append_pair("attempt", &attempt.to_string()).append_pair("follow", "true");
    let Ok(mut response) = api.send(|| api.request(Method::GET, url.clone()), Repeat::Safe).await else {
        return Streamed::Broken;
    };
    let mut wrote = false;
    let mut err = std::io::stderr();
    loop {
        match timeout(IDLE, response.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                use std::io::Write as _;
                wrote |= !bytes.is_empty();
                if err.write_all(&bytes).and_then(|()| err.flush()).is_err() {
                    return Streamed::Broken;
                }
            }
            Ok(Ok(None)) if wrote => return Streamed::Whole,
            _ => return Streamed::Broken,
        }
    }
}

/// Prints the end of the last attempt's log to standard error. A server without logs
/// answers 404, and then there is nothing to show; the job's outcome never depends on this.
async fn log_tail(api: &Api, job: &str, last: &Value) {
    let Some(attempt) = last.get("attempt").and_then(Value::as_i64).filter(|a| *a > 0) else { return };
    let mut url = api.url(&["jobs", job, "logs"]);
    url.query_pairs_mut().append_pair("attempt", &attempt.to_string()).append_pair("follow", "false");
    let opened = api.send(|| api.request(Method::GET, url.clone()), Repeat::Safe).await;
    let mut response = match opened {
        Ok(response) => response,
        Err(e) if e.is_not_found() => return,
        Err(e) => {
            eprintln!("fairway: no log to show: {}", e.report().trim_start_matches("fairway: "));
            return;
        }
    };
    let mut lines: VecDeque<String> = VecDeque::with_capacity(LOG_TAIL_LINES + 1);
    let mut partial = Vec::new();
    let keep = |line: &[u8], lines: &mut VecDeque<String>| {
        lines.push_back(String::from_utf8_lossy(line).trim_end_matches('\r').to_owned());
        if lines.len() > LOG_TAIL_LINES {
            lines.pop_front();
        }
    };
    // Read to the end, keeping only the last lines: the log may be long.
    while let Ok(Ok(Some(bytes))) = timeout(IDLE, response.chunk()).await {
        partial.extend_from_slice(&bytes);
        while let Some(end) = partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            keep(&line[..end], &mut lines);
        }
    }
    if !partial.is_empty() {
        keep(&partial, &mut lines);
    }
    if lines.is_empty() {
        return;
    }
    eprintln!("--- last {} lines of attempt {attempt}'s log ---", lines.len());
    for line in lines {
        eprintln!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_finished_job_maps_to_the_documented_exit_status() {
        assert_eq!(outcome(&json!({"state": "succeeded", "exit_code": 0})), Finish::Exit(Exit::Success));
        assert_eq!(outcome(&json!({"state": "failed", "exit_code": 3})), Finish::Job(3));
        // The job's own code wins, even where it is one of the client's numbers.
        assert_eq!(outcome(&json!({"state": "failed", "exit_code": 125})), Finish::Job(125));
        assert_eq!(outcome(&json!({"state": "failed", "exit_code": null})), Finish::Exit(Exit::FailedWithoutCode));
        assert_eq!(outcome(&json!({"state": "failed", "exit_code": 300})), Finish::Exit(Exit::FailedWithoutCode));
        assert_eq!(outcome(&json!({"state": "cancelled"})), Finish::Exit(Exit::Cancelled));
        assert_eq!(outcome(&json!({"state": "preempted"})), Finish::Exit(Exit::Preempted));
    }

    #[test]
    fn a_preempted_job_is_final_only_once_it_finished() {
        assert!(!is_final(&json!({"state": "preempted", "finished_at": null})));
        assert!(is_final(&json!({"state": "preempted", "finished_at": "2026-05-01T12:00:00Z"})));
        assert!(is_final(&json!({"state": "cancelled"})));
        assert!(!is_final(&json!({"state": "running"})));
    }
}
