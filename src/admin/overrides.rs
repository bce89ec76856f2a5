//! `GET /api/overrides` and `DELETE /api/overrides/{key name}`: the partner upgrades in force,
//! and an operator's removal of one (the key back on its YAML plan, everywhere the overrides
//! are kept).

use http::{Response, StatusCode};

use super::codes::AdminCode;
use super::reply::{json, no_content, problem};
use super::view::OverridesView;
use super::Admin;

/// `GET /api/overrides`.
pub(super) fn list(admin: &Admin) -> Response<Vec<u8>> {
    let snap = admin.live.load();
    let overrides = admin.changes.shown(&snap.policy);
    json(StatusCode::OK, &OverridesView { overrides })
}

/// `DELETE /api/overrides/{key name}`: 204, or 404 when the key had no override.
pub(super) async fn delete(admin: &Admin, name: &str) -> Response<Vec<u8>> {
    match admin.changes.remove(name).await {
        Ok(true) => no_content(),
        Ok(false) => problem(
            AdminCode::NoOverride,
            &format!("no key named `{name}` has a plan override"),
        ),
        Err(why) => problem(AdminCode::ChangeNotKept, &why.to_string()),
    }
}
