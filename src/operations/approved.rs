//! An approved action being run ([`super::approvals`]): who approved it, named in the
//! audit reason of the action it runs.

/// An approved action being run: its approval and who approved it.
#[derive(Debug, Clone)]
pub struct Approved {
    /// The approval.
    pub id: i64,
    /// Who approved it.
    pub by: String,
    /// How many tasks it was approved for: it changes no more.
    pub selected: i64,
}

impl Approved {
    /// The audit reason of the approved action: the requester's, naming the approver.
    pub(super) fn reason(&self, reason: Option<String>) -> String {
        let approved = format!("approved by {} (approval {})", self.by, self.id);
        match reason {
            Some(reason) => format!("{reason}; {approved}"),
            None => approved,
        }
    }
}

/// The reason an action is audited with: `reason`, naming the approver when approved.
pub(super) fn audited_reason(
    reason: Option<String>,
    approved: Option<&Approved>,
) -> Option<String> {
    match approved {
        Some(approved) => Some(approved.reason(reason)),
        None => reason,
    }
}
