//! Every kind of change to a key, one row each ([`ChangeKind`]): its name, which is the
//! `action` label of `tollgate_admin_changes_total` and the `action` of the `key changed` log
//! line, and the part of the key's record it changes ([`Part`], a table of its own beside
//! this one, whose word is the page's).

use super::action::Action;
use super::part::Part;
use crate::config::routes::Effect;

/// One row per kind of change: the variant, its name, the part it changes.
macro_rules! kinds {
    ($($(#[$doc:meta])* $kind:ident => $name:literal, $part:ident;)*) => {
        /// A kind of change to a key (see the module's docs).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ChangeKind {
            $($(#[$doc])* $kind,)*
        }

        impl ChangeKind {
            /// Every row, in the order of the table.
            pub const ALL: &'static [ChangeKind] = &[$(ChangeKind::$kind),*];

            /// Its name: the metric's `action` label, the log line's `action`.
            pub fn as_str(self) -> &'static str {
                match self { $(ChangeKind::$kind => $name,)* }
            }

            /// The part of the key's record it changes.
            pub fn part(self) -> Part {
                match self { $(ChangeKind::$kind => Part::$part,)* }
            }
        }
    };
}

kinds! {
    /// A key issued through the admin API (`POST /api/keys`).
    Create => "create", Issued;
    /// An issued key's new secret (`POST /api/keys/{name}/rotate`).
    Rotate => "rotate", Issued;
    /// An issued key revoked and forgotten (`DELETE /api/keys/{name}`).
    Delete => "delete", Issued;
    /// The operator's suspension.
    Suspend => "suspend", Suspended;
    /// The operator's resume.
    Resume => "resume", Suspended;
    /// The operator's revocation (by name, or by the secret).
    Revoke => "revoke", Revoked;
    /// A key's own window limit, set or cleared.
    Limit => "limit", Limit;
    /// A key's own quota, set or cleared.
    Quota => "quota", Quota;
    /// A partner's upgrade the upstream accepted.
    Upgrade => "upgrade", Plan;
    /// A partner's suspension the upstream accepted.
    PartnerSuspend => "partner_suspend", Suspended;
    /// A partner's resume the upstream accepted.
    PartnerResume => "partner_resume", Suspended;
    /// A partner's deletion the upstream accepted: the customer key revoked.
    PartnerDelete => "partner_delete", Revoked;
}

impl ChangeKind {
    /// The kind of change a partner operation's effect is.
    pub fn of_effect(effect: Effect) -> ChangeKind {
        match effect {
            Effect::Upgrade => ChangeKind::Upgrade,
            Effect::Suspend => ChangeKind::PartnerSuspend,
            Effect::Resume => ChangeKind::PartnerResume,
            Effect::Delete => ChangeKind::PartnerDelete,
        }
    }

    /// The kind of change an operator's action is.
    pub fn of_action(action: &Action) -> ChangeKind {
        match action {
            Action::Suspend(_) => ChangeKind::Suspend,
            Action::Resume => ChangeKind::Resume,
            Action::Revoke => ChangeKind::Revoke,
            Action::Limit(_) => ChangeKind::Limit,
            Action::Quota(_) => ChangeKind::Quota,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_snake_case_and_partner_kinds_say_so() {
        let mut seen = std::collections::HashSet::new();
        for k in ChangeKind::ALL {
            let s = k.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
        }
        for e in [Effect::Suspend, Effect::Resume, Effect::Delete] {
            assert!(ChangeKind::of_effect(e).as_str().starts_with("partner_"));
        }
        assert_eq!(ChangeKind::Delete.part(), Part::Issued);
        assert_eq!(ChangeKind::of_action(&Action::Revoke), ChangeKind::Revoke);
    }
}
