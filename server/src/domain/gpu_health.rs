//! GPU health from NVIDIA DCGM's fields: which values are a fault, in words, and the rule that
//! turns a sticky gauge into one fault per failure.
//!
//! `DCGM_FI_DEV_XID_ERRORS` holds the number of the last XID the driver logged, and keeps it
//! until the driver reloads or dcgm-exporter restarts; `DCGM_FI_DEV_ROW_REMAP_FAILURE` is 1
//! once the GPU failed to remap a memory row. So a fault is a *change* to a value that is a
//! fault ([`opens`]): read against the last value recorded for the GPU, an XID still held
//! from a failure an operator has dealt with does not quarantine the node again.
//!
//! Only XIDs after which NVIDIA's XID catalog has the GPU reset or the node rebooted are
//! faults ([`critical_xid`]): the GPU cannot run work until a person acts. XIDs that end one
//! application (13, 31, 43, 45, and 94, an ECC error the hardware contained) say nothing of
//! the GPU and are left to the job's own failure.

/// Who reported a node's GPU fault, which says how it clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum FaultSource {
    /// A condition or taint on the node (as NVIDIA's NVSentinel sets them): it clears when
    /// they do.
    Node,
    /// A GPU's DCGM fields: it stays until a platform admin clears it.
    Dcgm,
}

/// The DCGM field holding the last XID a GPU reported.
pub const XID_ERRORS: &str = "DCGM_FI_DEV_XID_ERRORS";
/// The DCGM field that is 1 once a GPU failed to remap a memory row.
pub const ROW_REMAP_FAILURE: &str = "DCGM_FI_DEV_ROW_REMAP_FAILURE";
/// Every health field read.
pub const FIELDS: [&str; 2] = [XID_ERRORS, ROW_REMAP_FAILURE];

/// The XIDs that take a GPU out of service, with what each means.
const CRITICAL_XIDS: [(u32, &str); 10] = [
    (48, "double-bit ECC error"),
    (62, "internal micro-controller halt"),
    (64, "ECC page retirement or row remapping recording failure"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (140, "unrecovered ECC error"),
];

/// What XID `xid` means, if it takes the GPU out of service.
pub fn critical_xid(xid: u32) -> Option<&'static str> {
    CRITICAL_XIDS.iter().find(|(n, _)| *n == xid).map(|(_, words)| *words)
}

/// Why `value` of health field `field` is a fault, in words; `None` when it is not one.
pub fn fault(field: &str, value: f64) -> Option<String> {
    if !value.is_finite() || value <= 0.0 {
        return None;
    }
    match field {
        XID_ERRORS => {
            let xid = value.round() as u32;
            critical_xid(xid).map(|words| format!("XID {xid} ({words})"))
        }
        ROW_REMAP_FAILURE => Some("row remapping failed: the GPU's memory has rows it can no longer repair".into()),
        _ => None,
    }
}

/// Whether a GPU whose field read `previous` last time (nothing when never read) and reads
/// `now` opens a fault, and why. A value never read before that is a fault opens one: it may
/// be left from before Fairway watched, but a GPU that says it failed is out until a person
/// says otherwise.
pub fn opens(field: &str, previous: Option<f64>, now: f64) -> Option<String> {
    if previous.is_some_and(|p| p == now) {
        return None;
    }
    fault(field, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_xid_that_needs_a_gpu_reset_is_a_fault_and_one_that_ends_only_an_application_is_not() {
        assert_eq!(fault(XID_ERRORS, 79.0).as_deref(), Some("XID 79 (GPU has fallen off the bus)"));
        assert_eq!(fault(XID_ERRORS, 48.0).as_deref(), Some("XID 48 (double-bit ECC error)"));
        for application_only in [0.0, 13.0, 31.0, 43.0, 45.0, 94.0] {
            assert_eq!(fault(XID_ERRORS, application_only), None, "XID {application_only}");
        }
        assert!(fault(ROW_REMAP_FAILURE, 1.0).unwrap().contains("row remapping failed"));
        assert_eq!(fault(ROW_REMAP_FAILURE, 0.0), None);
        assert_eq!(fault("DCGM_FI_DEV_GPU_UTIL", 79.0), None);
        assert_eq!(fault(XID_ERRORS, f64::NAN), None);
    }

    #[test]
    fn a_sticky_xid_opens_a_fault_once_when_it_changes_and_again_only_for_a_new_failure() {
        // First seen: a GPU that says it failed is out.
        assert!(opens(XID_ERRORS, None, 79.0).is_some());
        assert_eq!(opens(XID_ERRORS, None, 0.0), None);
        // The gauge keeps 79 after the failure: no second fault, even once it was cleared.
        assert_eq!(opens(XID_ERRORS, Some(79.0), 79.0), None);
        // A healthy GPU whose gauge moves to a critical XID fails now.
        assert!(opens(XID_ERRORS, Some(0.0), 79.0).is_some());
        assert!(opens(XID_ERRORS, Some(13.0), 48.0).unwrap().contains("XID 48"));
        // A move to an application's XID is not a fault.
        assert_eq!(opens(XID_ERRORS, Some(79.0), 13.0), None);
        assert!(opens(ROW_REMAP_FAILURE, Some(0.0), 1.0).is_some());
    }
}
