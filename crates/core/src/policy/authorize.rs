//! Authorize: may this caller use this route?
//!
//! Two questions, in this order:
//! 1. **Credential kind** (spec section 5): customer operations take a customer key, partner
//!    operations a partner key; a swap is `403 wrong_credential`.
//! 2. **Plan** (spec section 8.2): a customer key's plan must allow the route. Allow-lists deny
//!    by default; `allow: all` admits every customer route, including `/v2/` paths the
//!    catalogue does not know. Partner keys are not on plans.
//!
//! Whether a partner may act on a particular customer (`not_your_customer`) depends on the
//! request body, so it is decided with the body check.

use super::keys::Credential;
use crate::config::routes::{Family, Route, RouteIdx};
use crate::config::{Allow, Plan};
use crate::refusal::{Code, Refusal};

/// Allow or refuse `credential` on `route` (at index `idx` of its catalogue).
pub fn authorize(
    credential: Credential,
    plans: &[Plan],
    route: &Route,
    idx: RouteIdx,
) -> Result<(), Refusal> {
    match (credential, route.family) {
        (Credential::Customer { plan, .. }, Family::Customer) => {
            let plan = &plans[plan];
            if plan_allows(&plan.allow, idx) {
                Ok(())
            } else {
                Err(Refusal::new(
                    Code::PlanRestricted,
                    format!("the {} plan does not include this operation", plan.name),
                ))
            }
        }
        (Credential::Partner { .. }, Family::Partner) => Ok(()),
        (Credential::Customer { .. }, Family::Partner) => Err(Refusal::new(
            Code::WrongCredential,
            "this is a Partner API operation; it takes a partner key",
        )),
        (Credential::Partner { .. }, Family::Customer) => Err(Refusal::new(
            Code::WrongCredential,
            "this is a customer API operation; it takes a customer key",
        )),
    }
}

/// Whether an allow-list admits the route. The synthetic `unknown` route is in no list, so it
/// passes only `all`.
pub fn plan_allows(allow: &Allow, route: RouteIdx) -> bool {
    match allow {
        Allow::All => true,
        Allow::Only(list) => list.contains(&route),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn check(key: &str, method: &str, path: &str) -> Result<(), Code> {
        let cfg = testing::config();
        let cred = testing::credential(&cfg, key);
        let m = crate::policy::classify::classify(&cfg.catalogue, method, path).unwrap();
        authorize(cred, &cfg.plans, cfg.catalogue.get(m.route), m.route).map_err(|r| r.code)
    }

    #[test]
    fn basic_allow_list_is_default_deny() {
        assert_eq!(check("basic-1", "POST", "/v2/sendMessage/"), Ok(()));
        assert_eq!(check("basic-1", "POST", "/v2/sendGroup"), Ok(()));
        assert_eq!(check("basic-1", "GET", "/v2/client/getState"), Ok(()));
        assert_eq!(
            check("basic-1", "POST", "/v2/settings/webhook/set"),
            Err(Code::PlanRestricted)
        );
        assert_eq!(
            check("basic-1", "GET", "/v2/somethingNew"),
            Err(Code::PlanRestricted)
        );
        assert_eq!(
            check("basic-1", "GET", "/v2/sendMessage/"),
            Err(Code::PlanRestricted)
        );
    }

    #[test]
    fn all_plans_reach_everything_in_the_customer_api() {
        for key in ["standard-1", "pro-1"] {
            assert_eq!(check(key, "POST", "/v2/settings/webhook/set"), Ok(()));
            assert_eq!(check(key, "GET", "/v2/somethingNew"), Ok(()));
        }
    }

    #[test]
    fn credential_swaps_are_refused() {
        assert_eq!(
            check("basic-1", "POST", "/v2/service/upgrade"),
            Err(Code::WrongCredential)
        );
        assert_eq!(
            check("pro-1", "POST", "/v2/service/upgrade"),
            Err(Code::WrongCredential)
        );
        assert_eq!(
            check("acme", "POST", "/v2/sendMessage/"),
            Err(Code::WrongCredential)
        );
        assert_eq!(
            check("acme", "GET", "/v2/somethingNew"),
            Err(Code::WrongCredential)
        );
        assert_eq!(check("acme", "POST", "/v2/service/upgrade"), Ok(()));
    }
}
