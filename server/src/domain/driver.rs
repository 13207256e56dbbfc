//! The GPU driver stack a node runs and a job may require: the NVIDIA driver's version
//! (`550.54.15`) and the CUDA version that driver supports (`12.4`), as GPU Feature Discovery
//! labels them (`nvidia.com/cuda.driver-version.full`, `nvidia.com/cuda.runtime-version.full`).
//! A job built against a newer CUDA than a node's driver supports fails at launch ("CUDA
//! driver version is insufficient"); a job that names its minimum is placed only where it
//! holds, so that failure never costs a start.

use std::{cmp::Ordering, fmt, str::FromStr};

/// A version of dotted decimal numbers, one to three of them, compared number by number with
/// missing numbers read as 0 (`12.4` = `12.4.0` < `12.10`). Copy, so the engine's nodes carry it.
#[derive(Debug, Clone, Copy)]
pub struct Version {
    parts: [u32; 3],
    /// Digits each number was written with, so it is shown as written (`580.159.04`, as
    /// `nvidia-smi` prints it, not `580.159.4`).
    widths: [u8; 3],
    /// How many numbers it was written with (`12.4`, not `12.4.0`).
    len: u8,
}

/// Why a version could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadVersion;

impl fmt::Display for BadVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("must be one to three dot-separated numbers, such as 550.54.15 or 12.4")
    }
}

impl std::error::Error for BadVersion {}

impl FromStr for Version {
    type Err = BadVersion;

    fn from_str(s: &str) -> Result<Self, BadVersion> {
        let mut parts = [0u32; 3];
        let mut widths = [0u8; 3];
        let mut len = 0u8;
        for piece in s.split('.') {
            // Six digits is far past any driver (550) or CUDA (12) number, and keeps u32 safe.
            if piece.is_empty() || piece.len() > 6 || !piece.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BadVersion);
            }
            let slot = parts.get_mut(usize::from(len)).ok_or(BadVersion)?;
            *slot = piece.parse().map_err(|_| BadVersion)?;
            widths[usize::from(len)] = piece.len() as u8;
            len += 1;
        }
        Ok(Self { parts, widths, len })
    }
}

impl Version {
    /// Its numbers, padded with zeros to three.
    pub fn parts(&self) -> [u32; 3] {
        self.parts
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}

impl Eq for Version {}

impl std::hash::Hash for Version {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts.hash(state);
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts.cmp(&other.parts)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in 0..usize::from(self.len.max(1)) {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{:0width$}", self.parts[i], width = usize::from(self.widths[i]))?;
        }
        Ok(())
    }
}

/// A job's minimum version as submitted, checked: `None` when it names none, the text when it
/// reads as a version, and a 422-worthy field error naming `field` when it does not.
pub fn check_version(field: &str, version: Option<&str>) -> Result<Option<String>, super::FieldError> {
    match version {
        None => Ok(None),
        Some(v) => match v.parse::<Version>() {
            Ok(_) => Ok(Some(v.to_owned())),
            Err(e) => Err(super::FieldError::new(field, "invalid_version", e.to_string())),
        },
    }
}

/// A driver stack: what a node runs, or the least a job accepts. `None` is unknown on a node
/// (its cluster did not say) and no requirement on a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DriverStack {
    /// The NVIDIA driver's version.
    pub driver: Option<Version>,
    /// The CUDA version the driver supports.
    pub cuda: Option<Version>,
}

impl DriverStack {
    /// Reads a stack from its stored text; text that is not a version reads as unknown.
    pub fn read(driver: Option<&str>, cuda: Option<&str>) -> Self {
        Self { driver: driver.and_then(|v| v.parse().ok()), cuda: cuda.and_then(|v| v.parse().ok()) }
    }

    /// Whether it requires anything (as a job's minimum).
    pub fn requires_any(&self) -> bool {
        self.driver.is_some() || self.cuda.is_some()
    }

    /// Whether a node running `self` holds a job that requires `min`: every version the job
    /// names is known on the node and at least the job's. A node whose cluster does not say
    /// which driver it runs holds only jobs that require none: a job that names one would
    /// otherwise fail at launch there.
    pub fn meets(&self, min: &DriverStack) -> bool {
        let holds = |have: Option<Version>, need: Option<Version>| need.is_none_or(|n| have.is_some_and(|h| h >= n));
        holds(self.driver, min.driver) && holds(self.cuda, min.cuda)
    }

    /// The requirement in words, e.g. `driver ≥ 550.54 and CUDA ≥ 12.4`; empty when none.
    pub fn as_minimum(&self) -> String {
        let mut words = Vec::new();
        if let Some(d) = self.driver {
            words.push(format!("driver ≥ {d}"));
        }
        if let Some(c) = self.cuda {
            words.push(format!("CUDA ≥ {c}"));
        }
        words.join(" and ")
    }
}

/// Nodes of one GPU class of one cluster that run one driver stack, as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The driver's version as reported (`550.90.07`); `None` where the nodes do not say.
    pub driver: Option<String>,
    pub cuda: Option<String>,
    pub nodes: i64,
    pub gpus: i64,
}

/// The warning for one GPU class of one cluster whose nodes run more than one driver version
/// (a node that does not say counts as a version of its own): the versions, newest first,
/// with their nodes, and what that means for jobs. `None` when they all run one.
pub fn mixed_warning(gpu_class: &str, installed: &[Installed]) -> Option<String> {
    let mut drivers: Vec<(Option<Version>, &Installed)> =
        installed.iter().map(|i| (i.driver.as_deref().and_then(|d| d.parse().ok()), i)).collect();
    drivers.sort_by_key(|d| std::cmp::Reverse(d.0));
    let mut versions: Vec<(Option<Version>, Vec<&Installed>)> = Vec::new();
    for (v, i) in drivers {
        match versions.last_mut() {
            Some((last, group)) if *last == v => group.push(i),
            _ => versions.push((v, vec![i])),
        }
    }
    if versions.len() < 2 {
        return None;
    }
    let parts: Vec<String> = versions
        .iter()
        .map(|(_, group)| {
            let nodes: i64 = group.iter().map(|i| i.nodes).sum();
            let node_word = if nodes == 1 { "node" } else { "nodes" };
            let cudas: Vec<&str> = group.iter().filter_map(|i| i.cuda.as_deref()).collect();
            let cuda = if cudas.is_empty() { String::new() } else { format!(" (CUDA {})", cudas.join(", ")) };
            match group[0].driver.as_deref() {
                Some(d) => format!("{d}{cuda} on {nodes} {node_word}"),
                None => format!("an unreported driver{cuda} on {nodes} {node_word}"),
            }
        })
        .collect();
    Some(format!(
        "{gpu_class} runs {} driver versions: {}; a job that requires a minimum version runs only on the nodes that meet it, and a job built for the newest may fail on the others",
        versions.len(),
        parts.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    #[test]
    fn versions_compare_number_by_number_not_as_text() {
        assert!(v("12.10") > v("12.4"), "10 > 4, though \"1\" < \"4\"");
        assert!(v("550.54.15") > v("535.104.05"));
        assert_eq!(v("12.4"), v("12.4.0"), "a missing number reads as 0");
        assert!(v("580") > v("575.99.99"));
    }

    #[test]
    fn a_version_is_shown_as_it_was_written() {
        assert_eq!(v("12.4").to_string(), "12.4");
        assert_eq!(v("580.159.04").to_string(), "580.159.04", "as nvidia-smi prints it");
        assert_eq!(v("580.159.04"), v("580.159.4"), "the zero is only how it is written");
        assert_eq!(v("550").to_string(), "550");
    }

    #[test]
    fn text_that_is_not_one_to_three_numbers_is_refused() {
        for bad in ["", "12.", ".4", "12.4.1.2", "v12", "12.x", "1234567", "-1", "12 .4", "12,4"] {
            assert_eq!(bad.parse::<Version>(), Err(BadVersion), "{bad:?}");
        }
    }

    #[test]
    fn a_node_holds_a_job_only_when_it_runs_at_least_every_version_the_job_names() {
        let node = DriverStack { driver: Some(v("550.54.15")), cuda: Some(v("12.4")) };
        assert!(node.meets(&DriverStack::default()), "no requirement");
        assert!(node.meets(&DriverStack { driver: Some(v("550.54")), cuda: None }));
        assert!(node.meets(&DriverStack { driver: Some(v("550.54.15")), cuda: Some(v("12.4")) }), "equal holds");
        assert!(!node.meets(&DriverStack { driver: Some(v("560")), cuda: None }));
        assert!(!node.meets(&DriverStack { driver: None, cuda: Some(v("12.6")) }));
    }

    #[test]
    fn a_node_of_unknown_driver_holds_only_jobs_that_require_none() {
        let unknown = DriverStack::default();
        assert!(unknown.meets(&DriverStack::default()));
        assert!(!unknown.meets(&DriverStack { driver: Some(v("1")), cuda: None }));
        let cuda_unknown = DriverStack { driver: Some(v("550")), cuda: None };
        assert!(!cuda_unknown.meets(&DriverStack { driver: None, cuda: Some(v("11.0")) }));
    }

    #[test]
    fn a_class_running_two_drivers_is_warned_about_newest_first_and_one_driver_is_not() {
        let at = |driver: Option<&str>, cuda: &str, nodes: i64| Installed {
            driver: driver.map(str::to_owned),
            cuda: Some(cuda.to_owned()),
            nodes,
            gpus: nodes * 8,
        };
        assert_eq!(mixed_warning("h100", &[at(Some("550.90.07"), "12.4", 4)]), None);
        let mixed = [at(Some("550.90.07"), "12.4", 4), at(Some("560.35.03"), "12.6", 3), at(None, "12.6", 1)];
        assert_eq!(
            mixed_warning("h100", &mixed).unwrap(),
            "h100 runs 3 driver versions: 560.35.03 (CUDA 12.6) on 3 nodes, 550.90.07 (CUDA 12.4) on 4 nodes, an unreported driver (CUDA 12.6) on 1 node; a job that requires a minimum version runs only on the nodes that meet it, and a job built for the newest may fail on the others"
        );
        // Versions that compare equal are one version however they are written.
        assert_eq!(mixed_warning("a100", &[at(Some("535.104.05"), "12.2", 1), at(Some("535.104.5"), "12.2", 1)]), None);
    }

    #[test]
    fn stored_text_that_is_not_a_version_reads_as_unknown() {
        let s = DriverStack::read(Some("550.54.15"), Some("twelve"));
        assert_eq!(s, DriverStack { driver: Some(v("550.54.15")), cuda: None });
        assert_eq!(s.as_minimum(), "driver ≥ 550.54.15");
    }
}
