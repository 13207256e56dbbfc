//! The client's settings: where the server is, who is calling, for which team, and how to
//! print. Each comes from the first of: a flag, its environment variable, the client's file,
//! a default.
//!
//! The file is `$FAIRWAY_CLIENT_CONFIG`, else `$XDG_CONFIG_HOME/fairway/client.toml`, else
//! `~/.config/fairway/client.toml`. `FAIRWAY_CONFIG` is the server's file and is never read
//! here: one machine may run both.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where a server runs when nothing says otherwise: `fairway serve`'s default address.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// The help heading the connection flags share.
const HEADING: &str = "Client options";

/// The connection flags, taken before or after a client command's name. Clap fills each
/// from its flag, else from its environment variable; the file and the defaults come after
/// ([`resolve`]).
///
/// They are global: `main.rs` keeps them off the server's commands, where `export` has an
/// `--output FILE` of its own. Environment values are never shown in `--help`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// Fairway server address [default: http://127.0.0.1:8080].
    #[arg(long, global = true, env = "FAIRWAY_URL", hide_env_values = true, value_name = "URL", help_heading = HEADING)]
    pub url: Option<String>,
    /// API token (`fwy_...`, scoped to one team) or a user's access token. Prefer the
    /// variable or the file: a flag shows in the process list.
    #[arg(long, global = true, env = "FAIRWAY_TOKEN", hide_env_values = true, value_name = "TOKEN", help_heading = HEADING)]
    pub token: Option<String>,
    /// Team to act for [default: the API token's team].
    #[arg(long, global = true, env = "FAIRWAY_TEAM", hide_env_values = true, value_name = "TEAM", help_heading = HEADING)]
    pub team: Option<String>,
    /// Output: `text` for people, `json` for the server's JSON [default: text].
    #[arg(
        long = "output",
        id = OUTPUT_ID,
        global = true,
        env = "FAIRWAY_OUTPUT",
        hide_env_values = true,
        value_name = "text|json",
        help_heading = HEADING
    )]
    pub output: Option<String>,
}

/// The clap id of `--output text|json`, distinct from `export`'s `--output FILE`.
pub const OUTPUT_ID: &str = "client_output";

/// The clap ids of the connection flags.
pub const IDS: [&str; 4] = ["url", "token", "team", OUTPUT_ID];

/// The client's file, as written by a person: every key is optional; an unknown key is an
/// error, so a typo does not silently fall back to a default.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Server address.
    pub url: Option<String>,
    /// Token.
    pub token: Option<String>,
    /// Team.
    pub team: Option<String>,
    /// `text` or `json`.
    pub output: Option<String>,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns and sentences.
    Text,
    /// The server's JSON, one document per line.
    Json,
}

/// The settings a command runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Server address, without a trailing slash.
    pub url: String,
    /// Bearer token, if any was given.
    pub token: Option<String>,
    /// Team named by a flag, the environment or the file; otherwise the token's.
    pub team: Option<String>,
    /// Output format.
    pub output: Output,
}

/// Layers the flags (with their environment variables) over the file over the defaults.
/// An empty value counts as absent, as an exported but empty variable means "unset" in CI.
pub fn resolve(flags: &Flags, file: &File) -> Result<Settings, String> {
    fn pick(flag: Option<&String>, file: Option<&String>) -> Option<String> {
        flag.filter(|v| !v.trim().is_empty()).or(file.filter(|v| !v.trim().is_empty())).map(|v| v.trim().to_owned())
    }
    let url = pick(flags.url.as_ref(), file.url.as_ref()).unwrap_or_else(|| DEFAULT_URL.to_owned());
    match reqwest::Url::parse(&url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
        _ => return Err(format!("`{url}` is not an http:// or https:// address (--url, FAIRWAY_URL, `url`)")),
    }
    let output = match pick(flags.output.as_ref(), file.output.as_ref()).as_deref() {
        None | Some("text") => Output::Text,
        Some("json") => Output::Json,
        Some(other) => {
            return Err(format!("output `{other}` is neither text nor json (--output, FAIRWAY_OUTPUT, `output`)"))
        }
    };
    Ok(Settings {
        url: url.trim_end_matches('/').to_owned(),
        token: pick(flags.token.as_ref(), file.token.as_ref()),
        team: pick(flags.team.as_ref(), file.team.as_ref()),
        output,
    })
}

/// The client's file, and whether it was named explicitly (then it must exist).
pub fn path(var: impl Fn(&str) -> Option<String>) -> Option<(PathBuf, bool)> {
    let var = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(explicit) = var("FAIRWAY_CLIENT_CONFIG") {
        return Some((PathBuf::from(explicit), true));
    }
    let base =
        var("XDG_CONFIG_HOME").map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".config")))?;
    Some((base.join("fairway").join("client.toml"), false))
}

/// Reads the client's file: an absent default file is an empty one. A file that holds a token
/// and that others may read earns a warning, as ssh gives for a private key.
pub fn load(var: impl Fn(&str) -> Option<String>) -> Result<File, String> {
    let Some((path, explicit)) = path(var) else { return Ok(File::default()) };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(File::default()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let file: File = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if file.token.is_some() {
        use std::os::unix::fs::PermissionsExt as _;
        if std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            eprintln!("fairway: warning: {} holds a token and others may read it; `chmod 600` it", path.display());
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn a_flag_or_its_variable_beats_the_file_which_beats_the_default() {
        let file = File {
            url: some("http://file:1"),
            token: some("file-token"),
            team: some("file-team"),
            output: some("json"),
        };
        let flags = Flags { url: some("http://flag:2/"), token: None, team: some("flag-team"), output: None };
        let settings = resolve(&flags, &file).unwrap();
        assert_eq!(
            settings,
            Settings {
                url: "http://flag:2".to_owned(),
                token: some("file-token"),
                team: some("flag-team"),
                output: Output::Json
            }
        );
        let defaults = resolve(&Flags::default(), &File::default()).unwrap();
        assert_eq!(defaults, Settings { url: DEFAULT_URL.to_owned(), token: None, team: None, output: Output::Text });
    }

    #[test]
    fn an_empty_value_counts_as_unset() {
        let file = File { team: some("file-team"), ..File::default() };
        let flags = Flags { team: some(""), token: some("  "), ..Flags::default() };
        let settings = resolve(&flags, &file).unwrap();
        assert_eq!(settings.team.as_deref(), Some("file-team"));
        assert_eq!(settings.token, None);
    }

    #[test]
    fn a_wrong_output_or_address_names_where_it_can_come_from() {
        let flags = Flags { output: some("yaml"), ..Flags::default() };
        assert!(resolve(&flags, &File::default()).unwrap_err().contains("FAIRWAY_OUTPUT"));
        let flags = Flags { url: some("127.0.0.1:8080"), ..Flags::default() };
        assert!(resolve(&flags, &File::default()).unwrap_err().contains("FAIRWAY_URL"));
    }

    #[test]
    fn the_file_is_the_named_one_else_under_xdg_config_home_else_under_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            let map: HashMap<&str, &str> = pairs.iter().copied().collect();
            move |name: &str| map.get(name).map(|v| (*v).to_owned())
        };
        let all = env(&[("FAIRWAY_CLIENT_CONFIG", "/etc/ci.toml"), ("XDG_CONFIG_HOME", "/x"), ("HOME", "/home/a")]);
        assert_eq!(path(all), Some((PathBuf::from("/etc/ci.toml"), true)));
        // The server's variable is not the client's.
        let xdg = env(&[("FAIRWAY_CONFIG", "/etc/fairway.toml"), ("XDG_CONFIG_HOME", "/x"), ("HOME", "/home/a")]);
        assert_eq!(path(xdg), Some((PathBuf::from("/x/fairway/client.toml"), false)));
        assert_eq!(
            path(env(&[("HOME", "/home/a")])),
            Some((PathBuf::from("/home/a/.config/fairway/client.toml"), false))
        );
        assert_eq!(path(env(&[])), None);
    }

    #[test]
    fn the_file_refuses_an_unknown_key_and_an_absent_default_file_is_empty() {
        let dir = std::env::temp_dir().join(format!("fairway-client-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("client.toml");
        std::fs::write(&file, "url = \"http://a:1\"\nteam = \"vision\"\n").unwrap();
        let named = |name: &str| (name == "FAIRWAY_CLIENT_CONFIG").then(|| file.display().to_string());
        assert_eq!(load(named).unwrap(), File { url: some("http://a:1"), team: some("vision"), ..File::default() });
        std::fs::write(&file, "tean = \"vision\"\n").unwrap();
        assert!(load(named).unwrap_err().contains("unknown field"));
        let home = |name: &str| (name == "HOME").then(|| dir.join("nobody").display().to_string());
        assert_eq!(load(home).unwrap(), File::default());
        std::fs::remove_file(&file).unwrap();
        assert!(load(named).unwrap_err().contains("cannot read"), "a named file must exist");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
