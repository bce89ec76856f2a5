//! Shadow mode on the wire: a plan with `shadow: true` forwards what its allow-list or limit
//! would refuse, and records it; everything else is enforced as ever.

use crate::harness::{admin, config_for, metric, metrics_page, Gateway, Mode, Upstream};

#[test]
fn a_shadow_plan_forwards_and_records_what_it_would_refuse() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).plan_shadow("basic", true));
    let hook = r#"{"url":"https://hooks.example.com/x"}"#;

    // The allow-list would refuse: forwarded, recorded as shadow_forbidden.
    let r = gw.call("basic-key-1", "POST", "/v2/settings/webhook/set", hook);
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 1);

    // The limit would refuse the 41st: forwarded, recorded as shadow_rate_limited, and the
    // answer's headers say the budget is spent.
    for _ in 0..39 {
        assert_eq!(
            gw.call("basic-key-1", "GET", "/v2/client/getStatus", "")
                .status,
            200
        );
    }
    let r = gw.call("basic-key-1", "GET", "/v2/client/getStatus", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.remaining(), 0);
    assert_eq!(up.count(), 41);

    // Always enforced: authentication, bodies, the credential's family, other plans.
    assert_eq!(
        gw.call("wrong-key", "GET", "/v2/client/getStatus", "")
            .status,
        401
    );
    let r = gw.call(
        "basic-key-1",
        "POST",
        "/v2/settings/webhook/set",
        r#"{"url":"http://127.0.0.1/"}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_body"));
    let r = gw.call(
        "basic-key-1",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"k","planID":2}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "wrong_credential"));
    for _ in 0..70 {
        gw.call("standard-key-1", "GET", "/v2/client/getStatus", "");
    }
    let r = gw.call("standard-key-1", "GET", "/v2/client/getStatus", "");
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limited"));
    assert_eq!(up.count(), 41 + 70);

    let page = metrics_page(gw.config.process.admin_listen);
    let series = |route: &str, outcome: &str| {
        metric(
            &page,
            &format!(
                "tollgate_requests_total{{outcome=\"{outcome}\",plan=\"basic\",route=\"{route}\"}}"
            ),
        )
    };
    assert_eq!(series("webhook_set", "shadow_forbidden"), Some(1.0));
    assert_eq!(series("client", "shadow_rate_limited"), Some(1.0));
    assert_eq!(series("client", "forwarded"), Some(39.0));

    // The usage view counts them apart (41 forwarded, 2 refused), and the plan says it is in shadow mode.
    let u = admin(
        gw.config.process.admin_listen,
        "GET",
        "/api/usage?key=basic-1",
    )
    .json();
    let row = &u["keys"][0];
    assert_eq!(row["key"], "basic-1");
    assert_eq!(
        (row["requests"].as_u64(), row["admitted"].as_u64()),
        (Some(43), Some(39))
    );
    assert_eq!(row["shadowed"], 2);
    assert_eq!(row["refusals"]["rate_limited"], 0);
    assert_eq!(row["refusals"]["invalid"], 1); // the private webhook URL
    assert_eq!(row["refusals"]["forbidden"], 1); // the partner route (wrong_credential)
    assert_eq!(u["config"]["plans"][0]["shadow"], true);
}
