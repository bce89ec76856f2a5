//! What kind of operation a catalogue route is: its API family (which credential it takes), the
//! shape its body must have, and what a partner's operation does at the edge. Shared by the
//! catalogue file's shape ([`super::file`]) and the compiled catalogue ([`super::routes`]),
//! so that neither imports the other for them.

/// Which API family an operation belongs to, and so which credential it takes (spec section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// The customer API: taken by a customer key (`keys`).
    Customer,
    /// The Partner API: taken by a partner key (`partners`).
    Partner,
}

/// The request-body shapes the spec gives (sections 2.1–2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRule {
    /// `group_event`: the group event (spec 2.1).
    GroupEvent,
    /// `webhook_set`: the webhook registration (spec 2.2).
    WebhookSet,
    /// `service_upgrade`: a partner's service upgrade, `apiKey` and `planID` (spec 2.3).
    ServiceUpgrade,
    /// `service_key`: a partner's lifecycle operation on one customer key, `apiKey` a
    /// non-empty string.
    ServiceKey,
}

/// What a partner route does at the edge when the upstream answers 2xx (`effect`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Move the customer key to the plan whose `plan_id` is the body's `planID`.
    Upgrade,
    /// Suspend the customer key.
    Suspend,
    /// Resume it.
    Resume,
    /// Delete it: revoke its digests for good.
    Delete,
}

impl BodyRule {
    /// The rule's name, as a catalogue's `body` field writes it.
    pub fn name(self) -> &'static str {
        match self {
            BodyRule::GroupEvent => "group_event",
            BodyRule::WebhookSet => "webhook_set",
            BodyRule::ServiceUpgrade => "service_upgrade",
            BodyRule::ServiceKey => "service_key",
        }
    }
}
