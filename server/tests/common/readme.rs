//! The README's shell examples as a test runs them: read from its fenced blocks, run in one
//! bash so variables carry from block to block as they do in a reader's terminal, and what
//! they print held to what the README shows.
//!
//! What differs from run to run (ids, times, secrets, object names) is matched by kind, and
//! one value shown in several places must be one value in the run, two shown values two values
//! (the dry run's expected start equal to its earliest and latest, a class's `created_at` to
//! its `updated_at`). `…` or `...` in what the README shows stands for anything. Everything
//! else (keys, codes, states, numbers, messages, warnings) must be as shown.

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    process::Stdio,
    sync::LazyLock,
    time::Duration,
};

use regex::Regex;
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};

/// Where the README points its examples, replaced by the test server's address.
pub const README_ADDRESS: &str = "http://127.0.0.1:8080";

/// A fenced block of the README.
#[derive(Debug, Clone)]
pub struct Block {
    /// The line of its opening fence, counted from 1.
    pub line: usize,
    pub lang: String,
    pub text: String,
}

/// A shell block to run, with the block the README shows beneath it as its output, if any.
#[derive(Debug)]
pub struct Example {
    pub commands: Block,
    pub shown: Option<Block>,
}

/// The examples of one stretch of the README and the environment its `serve` command sets.
#[derive(Debug)]
pub struct Examples {
    pub serve_env: Vec<(String, String)>,
    pub examples: Vec<Example>,
}

/// The fenced blocks between the heading `from` and the heading `to`.
pub fn blocks(readme: &str, from: &str, to: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let start = lines.iter().position(|l| *l == from).unwrap_or_else(|| panic!("the README has no heading {from:?}"));
    let end = start
        + lines[start..].iter().position(|l| *l == to).unwrap_or_else(|| panic!("the README has no heading {to:?}"));
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in lines.iter().enumerate().take(end).skip(start) {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => open = Some(Block { line: i + 1, lang: lang.trim().to_owned(), text: String::new() }),
            (Some(_), Some("")) => blocks.push(open.take().unwrap()),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fenced block of the README opened at line {} is not closed", open.unwrap().line);
    blocks
}

/// Splits the blocks into the one `serve` command (whose environment the test server gets)
/// and the examples run against it; `serve --demo` is an aside, not part of the sequence.
pub fn examples(blocks: Vec<Block>) -> Examples {
    let mut serve_env = None;
    let mut examples: Vec<Example> = Vec::new();
    // Whether the previous block was a command whose output may follow.
    let mut awaiting_output = false;
    for block in blocks {
        match block.lang.as_str() {
            "sh" if block.text.contains("-- serve") => {
                awaiting_output = false;
                if block.text.contains("--demo") {
                    continue;
                }
                assert!(
                    serve_env.is_none(),
                    "README line {}: a second `serve` command; the examples are run against one server",
                    block.line
                );
                serve_env = Some(serve_environment(&block));
            }
            "sh" => {
                examples.push(Example { commands: block, shown: None });
                awaiting_output = true;
            }
            "json" | "text" => {
                assert!(awaiting_output, "README line {}: an output block that follows no command", block.line);
                examples.last_mut().unwrap().shown = Some(block);
                awaiting_output = false;
            }
            other => panic!("README line {}: a block of {other:?} among the shell examples", block.line),
        }
    }
    let serve_env = serve_env.expect("the README's examples start no server (`cargo run ... -- serve`)");
    Examples { serve_env, examples }
}

/// `NAME=value ... cargo run --release -p fairway -- serve`: the variables, checked to be the
/// service's own and the command to be that exactly, so the test runs what the reader runs.
fn serve_environment(block: &Block) -> Vec<(String, String)> {
    let command = block.text.replace("\\\n", " ");
    let words: Vec<&str> = command.split_whitespace().collect();
    let split = words.iter().position(|w| !w.contains('=')).unwrap_or(words.len());
    assert_eq!(
        words[split..],
        ["cargo", "run", "--release", "-p", "fairway", "--", "serve"],
        "README line {}: a serve command this test does not know how to run:\n{}",
        block.line,
        block.text
    );
    words[..split]
        .iter()
        .map(|w| {
            let (name, value) = w.split_once('=').unwrap();
            assert!(name.starts_with("FAIRWAY_"), "README line {}: {name} is not a setting of the service", block.line);
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

/// A bash that runs blocks one after another, keeping its variables, with stderr in its output.
pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    dir: PathBuf,
    runs: usize,
}

/// Printed after each block so its output can be told from the next one's.
const MARKER: &str = "~~~ fairway readme test: block done ~~~";

impl Shell {
    /// Starts bash in `dir` with a plain environment: no proxies, none of the reader's
    /// variables; `PATH` as the test's.
    pub async fn start(dir: &Path) -> Self {
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
            .env("HOME", dir)
            .env("LC_ALL", "C.UTF-8")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start bash");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut shell = Self { child, stdin, stdout, dir: dir.to_owned(), runs: 0 };
        shell.stdin.write_all(b"exec 2>&1\n").await.unwrap();
        shell
    }

    /// Runs `script` in the shell and returns what it printed; `Err` with what it had printed
    /// if it was not done within `limit`, or if bash is gone.
    pub async fn run(&mut self, script: &str, limit: Duration) -> Result<String, String> {
        self.runs += 1;
        // From a file, with stdin closed: a command that reads stdin must not eat the
        // blocks that follow it.
        let path = self.dir.join(format!("block-{}.sh", self.runs));
        fs::write(&path, script).unwrap();
        let line = format!("source '{}' </dev/null; printf '\\n%s\\n' '{MARKER}'\n", path.display());
        self.stdin.write_all(line.as_bytes()).await.map_err(|e| format!("bash is gone: {e}"))?;
        let mut printed: Vec<String> = Vec::new();
        let read = tokio::time::timeout(limit, async {
            loop {
                match self.stdout.next_line().await {
                    Ok(Some(line)) if line == MARKER => return Ok(()),
                    Ok(Some(line)) => printed.push(line),
                    Ok(None) => return Err("bash exited".to_owned()),
                    Err(e) => return Err(format!("cannot read bash's output: {e}")),
                }
            }
        })
        .await;
        match read {
            Ok(Ok(())) => {
                // The marker's own leading newline ends output that did not end a line, and
                // adds an empty line to output that did.
                if printed.last().is_some_and(String::is_empty) {
                    printed.pop();
                }
                Ok(printed.join("\n"))
            }
            Ok(Err(why)) => Err(format!("{why}; it had printed:\n{}", printed.join("\n"))),
            Err(_) => Err(format!("not done within {limit:?}; it had printed:\n{}", printed.join("\n"))),
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// What stands for one value in the README and in a run: a value shown in several places is
/// one value of the run, and two values shown are two values printed.
#[derive(Default)]
pub struct Bindings {
    shown_to_printed: HashMap<String, String>,
    printed_to_shown: HashMap<String, String>,
}

impl Bindings {
    fn bind(&mut self, shown: &str, printed: &str) -> Result<(), String> {
        if let Some(before) = self.shown_to_printed.get(shown).filter(|b| *b != printed) {
            return Err(format!(
                "the README shows {shown} for one value in more than one place, but the server printed {before} and then {printed}"
            ));
        }
        if let Some(before) = self.printed_to_shown.get(printed).filter(|b| *b != shown) {
            return Err(format!(
                "the server printed {printed} in two places where the README shows two values, {before} and {shown}"
            ));
        }
        self.shown_to_printed.insert(shown.to_owned(), printed.to_owned());
        self.printed_to_shown.insert(printed.to_owned(), shown.to_owned());
        Ok(())
    }
}

/// Values that differ from run to run, by kind (a time of day in a sentence among them), and
/// the README's elisions.
static VOLATILE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
        r"|(?P<time>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2}))",
        r"|(?P<clock>[0-9]{2}:[0-9]{2}:[0-9]{2} UTC)",
        r"|(?P<object>fw-[0-9a-f]{32})",
        r"|(?P<secret>fwy_[A-Za-z0-9]+)",
        r"|(?P<elided>…|\.\.\.)",
    ))
    .unwrap()
});

/// The pattern of each kind in what the server prints.
fn kind_pattern(kind: &str) -> &'static str {
    match kind {
        "uuid" => r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})",
        "time" => r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}:[0-9]{2}))",
        "clock" => r"([0-9]{2}:[0-9]{2}:[0-9]{2} UTC)",
        "object" => r"(fw-[0-9a-f]{32})",
        "secret" => r"(fwy_[A-Za-z0-9]+)",
        "elided" => r"(?s:.*?)",
        _ => unreachable!("a kind of VOLATILE"),
    }
}

/// Whether `printed` is the string `shown` stands for.
fn same_string(shown: &str, printed: &str, bindings: &mut Bindings) -> Result<(), String> {
    let mut pattern = String::from("^");
    let mut values: Vec<&str> = Vec::new();
    let mut at = 0;
    for caps in VOLATILE.captures_iter(shown) {
        let whole = caps.get(0).unwrap();
        pattern.push_str(&regex::escape(&shown[at..whole.start()]));
        let kind = ["uuid", "time", "clock", "object", "secret", "elided"]
            .into_iter()
            .find(|k| caps.name(k).is_some())
            .unwrap();
        pattern.push_str(kind_pattern(kind));
        if kind != "elided" {
            values.push(whole.as_str());
        }
        at = whole.end();
    }
    pattern.push_str(&regex::escape(&shown[at..]));
    pattern.push('$');
    let caps = Regex::new(&pattern)
        .unwrap()
        .captures(printed)
        .ok_or_else(|| format!("the server printed\n    {printed}\nwhere the README shows\n    {shown}"))?;
    for (shown_value, printed_value) in values.into_iter().zip(caps.iter().skip(1)) {
        bindings.bind(shown_value, printed_value.unwrap().as_str())?;
    }
    Ok(())
}

/// Whether `printed` is the JSON value `shown` stands for, key by key; `at` names the place.
fn same_json(at: &str, shown: &Value, printed: &Value, bindings: &mut Bindings) -> Result<(), String> {
    match (shown, printed) {
        (Value::String(s), Value::String(p)) => same_string(s, p, bindings).map_err(|e| format!("at {at}: {e}")),
        (Value::Object(s), Value::Object(p)) => {
            let (shown_keys, printed_keys): (BTreeSet<&String>, BTreeSet<&String>) =
                (s.keys().collect(), p.keys().collect());
            if shown_keys != printed_keys {
                return Err(format!(
                    "at {at}: the README shows the keys {:?}, the server printed {:?}",
                    shown_keys.difference(&printed_keys).collect::<Vec<_>>(),
                    printed_keys.difference(&shown_keys).collect::<Vec<_>>()
                ));
            }
            s.iter().try_for_each(|(k, v)| same_json(&format!("{at}.{k}"), v, &p[k], bindings))
        }
        (Value::Array(s), Value::Array(p)) => {
            if s.len() != p.len() {
                return Err(format!("at {at}: the README shows {} items, the server printed {}", s.len(), p.len()));
            }
            s.iter().zip(p).enumerate().try_for_each(|(i, (s, p))| same_json(&format!("{at}[{i}]"), s, p, bindings))
        }
        _ if shown == printed => Ok(()),
        _ => Err(format!("at {at}: the README shows {shown}, the server printed {printed}")),
    }
}

/// The JSON documents of a text, one after another (compact lines or pretty-printed).
fn json_documents(text: &str) -> Result<Vec<Value>, String> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not JSON ({e})"))
}

/// Whether `printed` is what `shown` shows (nothing at all where the README shows no output).
pub fn compare(shown: Option<&Block>, printed: &str, bindings: &mut Bindings) -> Result<(), String> {
    let Some(shown) = shown else {
        return match printed.trim() {
            "" => Ok(()),
            _ => Err("it printed something where the README shows nothing".to_owned()),
        };
    };
    if shown.lang == "json" {
        let documents = json_documents(&shown.text).map_err(|e| format!("the README's output is {e}"))?;
        let printed = json_documents(printed).map_err(|e| format!("the server's output is {e}"))?;
        if documents.len() != printed.len() {
            return Err(format!(
                "the README shows {} JSON documents, the server printed {}",
                documents.len(),
                printed.len()
            ));
        }
        return documents
            .iter()
            .zip(&printed)
            .enumerate()
            .try_for_each(|(i, (s, p))| same_json(&format!("document {}", i + 1), s, p, bindings));
    }
    let (shown_lines, printed_lines): (Vec<&str>, Vec<&str>) =
        (shown.text.trim_end_matches('\n').lines().collect(), printed.lines().collect());
    if shown_lines.len() != printed_lines.len() {
        return Err(format!(
            "the README shows {} lines, the server printed {}",
            shown_lines.len(),
            printed_lines.len()
        ));
    }
    for (i, (s, p)) in shown_lines.iter().zip(&printed_lines).enumerate() {
        let at = format!("line {}", i + 1);
        match (serde_json::from_str::<Value>(s), serde_json::from_str::<Value>(p)) {
            (Ok(s @ (Value::Object(_) | Value::Array(_))), Ok(p)) => same_json(&at, &s, &p, bindings)?,
            _ => same_string(s, p, bindings).map_err(|e| format!("at {at}: {e}"))?,
        }
    }
    Ok(())
}
