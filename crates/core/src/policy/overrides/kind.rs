//! Two tables. Every part of a key's record, one row each ([`Part`]): the suffix that names
//! its field where it is kept (Redis, `state.path`) and its word, which is the page's and the
//! `dropped` of the `override dropped` log line. Every kind of change to a key, one row each
//! ([`ChangeKind`]): its name, which is the `action` label of `tollgate_admin_changes_total`
//! and the `action` of the `key changed` log line, and the part of the record it changes.

use super::action::Action;
use crate::config::routes::Effect;

/// One row per part: the variant, the suffix of its field, its word.
macro_rules! parts {
    ($($(#[$doc:meta])* $part:ident => $suffix:literal, $word:literal;)*) => {
        /// One part of a [`KeyRecord`](super::KeyRecord), kept on its own (see the module's
        /// docs).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Part {
            $($(#[$doc])* $part,)*
        }

        impl Part {
            /// Every part, in the order of the table.
            pub const ALL: [Part; [$(Part::$part),*].len()] = [$(Part::$part),*];

            /// What is appended to a digest's name for this part (the upgrade's name is the
            /// digest's own, as in part two).
            pub fn suffix(self) -> &'static str {
                match self { $(Part::$part => $suffix,)* }
            }

            /// The part in words (`upgrade`, `suspended`, `revoked`, `limit`, `quota`,
            /// `issued`).
            pub fn name(self) -> &'static str {
                match self { $(Part::$part => $word,)* }
            }
        }
    };
}

parts! {
    /// A partner's upgrade.
    Plan => "", "upgrade";
    /// A suspension.
    Suspended => ":s", "suspended";
    /// A revocation.
    Revoked => ":r", "revoked";
    /// A live window limit.
    Limit => ":l", "limit";
    /// A live quota.
    Quota => ":q", "quota";
    /// A key issued through the admin API.
    Issued => ":k", "issued";
}

impl Part {
    /// The part a suffix names.
    pub fn of_suffix(suffix: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.suffix() == suffix)
    }
}

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
    fn each_part_has_its_own_suffix_and_word_and_each_suffix_names_its_part() {
        let mut suffixes = std::collections::HashSet::new();
        let mut words = std::collections::HashSet::new();
        for p in Part::ALL {
            assert!(suffixes.insert(p.suffix()), "{p:?}'s suffix twice");
            assert!(words.insert(p.name()), "{p:?}'s word twice");
            assert_eq!(Part::of_suffix(p.suffix()), Some(p));
        }
        // The upgrade's field is the digest's own (part two); the others one letter after it.
        assert_eq!(Part::Plan.suffix(), "");
        assert_eq!(Part::of_suffix(":x"), None);
        // Every kind of change names one of them.
        for k in ChangeKind::ALL {
            assert!(Part::ALL.contains(&k.part()), "{k:?}");
        }
    }

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
