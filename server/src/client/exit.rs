//! What the client's exit status means, in one place: CI systems branch on it, so every code
//! is part of the command's interface.

/// The client's exit statuses, other than a failed job's own exit code.
///
/// | code | meaning |
/// | --- | --- |
/// | 0 | succeeded (the job, or the request) |
/// | 1..=255 | a job that failed with its own exit code: that code (it wins over every code below) |
/// | 2 | bad usage: a flag, a job file, the client's settings |
/// | 65 | the server refused the request (a 4xx other than 401 and 403) |
/// | 69 | the server could not be reached, or answered 5xx |
/// | 77 | not authenticated or not allowed (401, 403) |
/// | 124 | `--timeout` elapsed; the job is left running |
/// | 125 | the job was cancelled |
/// | 126 | the job was preempted beyond its retries |
/// | 127 | the job failed without an exit code (deadline exceeded, node lost) |
/// | 130 | interrupted by SIGINT (the job was cancelled unless `--detach`) |
/// | 143 | interrupted by SIGTERM (likewise) |
///
/// The numbers follow conventions a shell user knows: 65, 69 and 77 are sysexits.h's
/// `EX_DATAERR`, `EX_UNAVAILABLE` and `EX_NOPERM`; 124 is `timeout(1)`'s; 125 to 127 mirror
/// what a shell answers when a command cannot run; 130 and 143 are 128 + the signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Exit {
    /// The job succeeded, or the request was done.
    Success = 0,
    /// A flag, a job file or a setting is wrong.
    Usage = 2,
    /// The server refused the request (4xx other than 401/403).
    Refused = 65,
    /// The server could not be reached or answered 5xx.
    Unavailable = 69,
    /// Not authenticated or not allowed (401/403).
    NotAllowed = 77,
    /// `--timeout` elapsed with the job still going.
    TimedOut = 124,
    /// The job was cancelled.
    Cancelled = 125,
    /// The job was preempted and out of retries.
    Preempted = 126,
    /// The job failed without an exit code of its own.
    FailedWithoutCode = 127,
    /// SIGINT arrived.
    Interrupted = 130,
    /// SIGTERM arrived.
    Terminated = 143,
}

/// How a command ends: one of the client's own statuses, or a failed job's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// One of the client's statuses.
    Exit(Exit),
    /// The job failed and exited with this code (1..=255).
    Job(u8),
}

impl Finish {
    /// The process exit status.
    pub fn code(self) -> u8 {
        match self {
            // Every discriminant of `Exit` is below 256.
            Finish::Exit(exit) => u8::try_from(exit as i32).unwrap_or(1),
            Finish::Job(code) => code,
        }
    }
}

impl From<Exit> for Finish {
    fn from(exit: Exit) -> Self {
        Finish::Exit(exit)
    }
}

/// The table above as `--help` shows it: a macro, so `concat!` can put it in a command's
/// `after_help`.
macro_rules! exit_status_help {
    () => {
        "Exit status:
  0        the job succeeded
  1-255    the job failed with this exit code of its own (it wins over the codes below)
  2        bad usage (a flag, the job file, the client's settings)
  65       the server refused the request (a 4xx other than 401/403)
  69       the server could not be reached, or answered 5xx
  77       not authenticated or not allowed (401/403)
  124      --timeout elapsed; the job is left running
  125      the job was cancelled
  126      the job was preempted beyond its retries
  127      the job failed without an exit code (deadline exceeded, node lost)
  130/143  interrupted by SIGINT/SIGTERM; the job was cancelled first, unless --detach"
    };
}
pub(crate) use exit_status_help;

/// The table above, for `--help`.
pub const HELP: &str = exit_status_help!();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_the_number_the_table_documents() {
        let table = [
            (Exit::Success, 0),
            (Exit::Usage, 2),
            (Exit::Refused, 65),
            (Exit::Unavailable, 69),
            (Exit::NotAllowed, 77),
            (Exit::TimedOut, 124),
            (Exit::Cancelled, 125),
            (Exit::Preempted, 126),
            (Exit::FailedWithoutCode, 127),
            (Exit::Interrupted, 130),
            (Exit::Terminated, 143),
        ];
        for (exit, code) in table {
            assert_eq!(Finish::from(exit).code(), code, "{exit:?}");
            assert!(HELP.contains(&code.to_string()), "--help does not document {code}");
        }
        assert_eq!(Finish::Job(3).code(), 3);
    }
}
