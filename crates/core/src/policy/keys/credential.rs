//! Who a key belongs to ([`Credential`]), the state the admin API and the gauge name
//! ([`KeyState`]), and why a bearer token did not authenticate ([`KeyRefusal`]).

/// Who a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A customer key on a plan (index into `Config::plans`), maybe managed by a partner.
    Customer {
        /// The plan's index into `Config::plans`.
        plan: usize,
        /// The managing partner's index into `Config::partners`; `None`: no partner manages it.
        partner: Option<usize>,
        /// The key's own window limit (`requests_per_window` of the key, or set live); 0: its
        /// plan's.
        limit: u32,
    },
    /// A partner key (index into `Config::partners`).
    Partner {
        /// The partner's index into `Config::partners`.
        partner: usize,
    },
}

impl Credential {
    /// The plan of a customer key (`None`: a partner key).
    pub fn plan(self) -> Option<usize> {
        match self {
            Credential::Customer { plan, .. } => Some(plan),
            Credential::Partner { .. } => None,
        }
    }
}

/// The state of a key, as the admin API and `tollgate_keys{state}` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// Authenticates.
    Active,
    /// Past its `expires_at` (or, for a `previous` digest, its `until`).
    Expired,
    /// Suspended by an operator or its partner, until resumed.
    Suspended,
    /// Revoked for good.
    Revoked,
}

impl KeyState {
    /// Every state, in the gauge's order.
    pub const ALL: [KeyState; 4] = [
        KeyState::Active,
        KeyState::Expired,
        KeyState::Suspended,
        KeyState::Revoked,
    ];

    /// `active`, `expired`, `suspended` or `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Expired => "expired",
            KeyState::Suspended => "suspended",
            KeyState::Revoked => "revoked",
        }
    }
}

/// Why a bearer token did not authenticate (`tollgate_key_refusals_total{reason}`); the client
/// gets the same 401 whatever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRefusal {
    /// No key, a malformed one, or one no entry has.
    Unknown,
    /// An expired key, or a `previous` digest past its `until`.
    Expired,
    /// A suspended key.
    Suspended,
    /// A revoked key (or digest).
    Revoked,
}

impl KeyRefusal {
    /// `unknown`, `expired`, `suspended` or `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRefusal::Unknown => "unknown",
            KeyRefusal::Expired => "expired",
            KeyRefusal::Suspended => "suspended",
            KeyRefusal::Revoked => "revoked",
        }
    }
}
