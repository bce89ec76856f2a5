//! The `limits` and `plans` sections (and `partner_requests_per_window`).

use std::collections::HashMap;
use std::num::NonZeroU32;

use indexmap::IndexMap;

use super::file::{FileAllow, FileLimits, FilePlan};
use super::routes::{Catalogue, Family};
use super::{
    check_name, nonzero_u32, nonzero_u64, Allow, Invalid, Limits, Plan, MAX_REQUESTS_PER_WINDOW,
    MAX_VALIDATED_BODY_BYTES, MAX_WINDOW_SECONDS,
};

pub(super) fn limits(f: &FileLimits) -> Result<Limits, Invalid> {
    let limits = Limits {
        window: nonzero_u32(
            f.window_seconds,
            "limits.window_seconds",
            MAX_WINDOW_SECONDS,
        )?,
        max_body_bytes: nonzero_u64(f.max_body_bytes, "limits.max_body_bytes")?,
        max_validated_body_bytes: nonzero_u64(
            f.max_validated_body_bytes,
            "limits.max_validated_body_bytes",
        )?,
    };
    if limits.max_validated_body_bytes.get() > MAX_VALIDATED_BODY_BYTES {
        return Err(Invalid::new(
            "limits.max_validated_body_bytes",
            format!("must be at most {MAX_VALIDATED_BODY_BYTES} (checked bodies are held in a 64 KiB buffer)"),
        ));
    }
    if limits.max_validated_body_bytes > limits.max_body_bytes {
        return Err(Invalid::new(
            "limits.max_validated_body_bytes",
            "must not be above limits.max_body_bytes",
        ));
    }
    Ok(limits)
}

pub(super) fn plans(
    file: IndexMap<String, FilePlan>,
    catalogue: &Catalogue,
) -> Result<Vec<Plan>, Invalid> {
    if file.is_empty() {
        return Err(Invalid::new("plans", "at least one plan is needed"));
    }
    let mut plans = Vec::with_capacity(file.len());
    let mut plan_ids: HashMap<u32, String> = HashMap::new();
    for (name, fp) in file {
        let at = format!("plans.{name}");
        check_name(&name, || at.clone())?;
        if matches!(name.as_str(), "partner" | "none") {
            // `partner` names the partner keys' policy and `none` an unknown caller, in
            // RateLimit headers, logs and metric labels.
            return Err(Invalid::new(at, format!("`{name}` is a reserved name")));
        }
        if let Some(other) = plan_ids.insert(fp.plan_id, name.clone()) {
            return Err(Invalid::new(
                format!("{at}.plan_id"),
                format!("plan_id {} is also used by plan `{other}`", fp.plan_id),
            ));
        }
        let limit = nonzero_u32(
            fp.requests_per_window,
            &format!("{at}.requests_per_window"),
            MAX_REQUESTS_PER_WINDOW,
        )?;
        let allow = allow(fp.allow, &at, catalogue)?;
        let quota = super::quota(fp.quota, &format!("{at}.quota"))?;
        plans.push(Plan {
            name,
            plan_id: fp.plan_id,
            limit,
            allow,
            shadow: fp.shadow,
            quota,
        });
    }
    Ok(plans)
}

/// A plan's `allow`: `all`, or customer route ids, each once.
fn allow(f: FileAllow, at: &str, catalogue: &Catalogue) -> Result<Allow, Invalid> {
    match f {
        FileAllow::Keyword(k) if k == "all" => Ok(Allow::All),
        FileAllow::Keyword(k) => Err(Invalid::new(
            format!("{at}.allow"),
            format!("`{k}` is not `all`; give `all` or a list of route ids"),
        )),
        FileAllow::List(ids) => {
            let mut idx = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                let field = format!("{at}.allow[{i}]");
                let Some(r) = catalogue.find(id) else {
                    return Err(Invalid::new(field, format!("unknown route id `{id}`")));
                };
                if catalogue.get(r).family == Family::Partner {
                    return Err(Invalid::new(
                        field,
                        format!("`{id}` is a partner operation; plans govern customer keys"),
                    ));
                }
                if idx.contains(&r) {
                    return Err(Invalid::new(field, format!("`{id}` is listed twice")));
                }
                idx.push(r);
            }
            Ok(Allow::Only(idx))
        }
    }
}

pub(super) fn partner_limit(v: u32) -> Result<NonZeroU32, Invalid> {
    nonzero_u32(v, "partner_requests_per_window", MAX_REQUESTS_PER_WINDOW)
}
