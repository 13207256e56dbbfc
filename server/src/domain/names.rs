//! Names of things users type: teams, users, GPU classes, priority classes, templates, CI
//! trust policies.

use std::fmt;

use serde::Serialize;

use super::FieldError;

/// Shared rule for identifier-like names: lowercase ASCII letters and digits, with the
/// given separators inside (never first or last, never two in a row).
pub(super) fn check_name(field: &str, value: &str, max: usize, separators: &[u8]) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(FieldError::new(field, "empty", "must not be empty"));
    }
    if value.len() > max {
        return Err(FieldError::new(field, "too_long", format!("must be at most {max} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(FieldError::new(field, "control_character", "must not contain control characters"));
    }
    let bytes = value.as_bytes();
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || separators.contains(&b);
    if !bytes.iter().all(|&b| allowed(b)) {
        let seps: String = separators.iter().map(|&b| format!(" '{}'", b as char)).collect();
        return Err(FieldError::new(
            field,
            "invalid_characters",
            format!("may contain only lowercase letters, digits and{seps}"),
        ));
    }
    let is_sep = |b: u8| separators.contains(&b);
    if is_sep(bytes[0]) || is_sep(bytes[bytes.len() - 1]) {
        return Err(FieldError::new(field, "invalid_format", "must start and end with a letter or digit"));
    }
    if bytes.windows(2).any(|w| is_sep(w[0]) && is_sep(w[1])) {
        return Err(FieldError::new(field, "invalid_format", "must not contain two separators in a row"));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, max = $max:expr, separators = $seps:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Parses `value`, reporting a failure against `field`.
            pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
                check_name(field, value, $max, $seps)?;
                Ok(Self(value.to_owned()))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A team's name: a DNS label (it becomes a Kubernetes namespace suffix), unique.
    TeamName, max = 63, separators = b"-"
);
name_type!(
    /// A user's login name.
    Username, max = 64, separators = b"-._"
);
name_type!(
    /// A GPU class, e.g. `h100-80gb` or `a100-80gb.mig-3g.40gb`.
    GpuClassName, max = 100, separators = b"-."
);
name_type!(
    /// A cluster's name, e.g. `gpu-east`: a DNS label (it becomes a Kubernetes label value).
    ClusterName, max = 63, separators = b"-"
);
name_type!(
    /// A priority class, e.g. `production`.
    PriorityClassName, max = 63, separators = b"-"
);
name_type!(
    /// A team's job template, e.g. `nightly-eval`: also the value of the label
    /// `fairway.dev/template` on the jobs submitted from it, so a Kubernetes label value.
    TemplateName, max = 63, separators = b"-_."
);
name_type!(
    /// A team's CI trust policy, e.g. `deploy-main`; the tokens exchanged under it are named
    /// `ci:<name>`.
    CiTrustName, max = 63, separators = b"-_."
);

/// Free text shown to people (display names, descriptions): no control characters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DisplayText(String);

impl DisplayText {
    /// Parses free text of at most `max` characters.
    pub fn parse(field: &str, value: &str, max: usize) -> Result<Self, FieldError> {
        if value.chars().count() > max {
            return Err(FieldError::new(field, "too_long", format!("must be at most {max} characters")));
        }
        if value.chars().any(char::is_control) {
            return Err(FieldError::new(field, "control_character", "must not contain control characters"));
        }
        Ok(Self(value.trim().to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A new password: long enough to resist guessing, short enough to hash cheaply.
#[derive(Clone)]
pub struct Password(String);

impl Password {
    /// Shortest accepted password.
    pub const MIN_LEN: usize = 12;

    /// Parses a new password.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        let len = value.chars().count();
        if len < Self::MIN_LEN {
            return Err(FieldError::new(field, "too_short", format!("must be at least {} characters", Self::MIN_LEN)));
        }
        if len > 256 {
            return Err(FieldError::new(field, "too_long", "must be at most 256 characters"));
        }
        Ok(Self(value.to_owned()))
    }

    /// The password, for hashing only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_names_are_dns_labels() {
        assert!(TeamName::parse("name", "ml-research").is_ok());
        assert!(TeamName::parse("name", "a").is_ok());
        assert_eq!(TeamName::parse("name", "").unwrap_err().code, "empty");
        assert_eq!(TeamName::parse("name", "ML").unwrap_err().code, "invalid_characters");
        assert_eq!(TeamName::parse("name", "-ml").unwrap_err().code, "invalid_format");
        assert_eq!(TeamName::parse("name", "ml--x").unwrap_err().code, "invalid_format");
        assert_eq!(TeamName::parse("name", &"a".repeat(64)).unwrap_err().code, "too_long");
        assert_eq!(TeamName::parse("name", "ml.x").unwrap_err().code, "invalid_characters");
    }

    #[test]
    fn control_characters_are_refused_with_their_own_code() {
        let err = TeamName::parse("name", "ml\u{0}x").unwrap_err();
        assert_eq!((err.field.as_str(), err.code.as_str()), ("name", "control_character"));
        let err = DisplayText::parse("display_name", "ML\nResearch", 200).unwrap_err();
        assert_eq!(err.code, "control_character");
    }

    #[test]
    fn gpu_class_names_allow_mig_profiles() {
        assert!(GpuClassName::parse("name", "a100-80gb.mig-3g.40gb").is_ok());
        assert!(GpuClassName::parse("name", "h100-80gb").is_ok());
        assert!(GpuClassName::parse("name", "h100_80gb").is_err());
        assert!(GpuClassName::parse("name", "h100.").is_err());
    }

    #[test]
    fn template_names_are_label_values() {
        assert!(TemplateName::parse("template", "nightly-eval_v2.1").is_ok());
        assert_eq!(TemplateName::parse("template", "Nightly").unwrap_err().code, "invalid_characters");
        assert_eq!(TemplateName::parse("template", "eval/x").unwrap_err().code, "invalid_characters");
        assert_eq!(TemplateName::parse("template", "_eval").unwrap_err().code, "invalid_format");
        assert_eq!(TemplateName::parse("template", &"a".repeat(64)).unwrap_err().code, "too_long");
    }

    #[test]
    fn passwords_must_be_long_and_never_print() {
        assert_eq!(Password::parse("password", "short").unwrap_err().code, "too_short");
        let p = Password::parse("password", "correct horse battery").unwrap();
        assert!(!format!("{p:?}").contains("horse"));
    }
}
