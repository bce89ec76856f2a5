//! Every part of a key's record, one row each ([`Part`]): the suffix that names its field
//! where it is kept (Redis, `state.path`), and its word, which is the page's and the `dropped`
//! of the `override dropped` log line. The kinds of change name the part each changes
//! ([`super::ChangeKind::part`]).

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::overrides::ChangeKind;

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
}
