//! Per-token ceilings: what a team token may set for its handlers, and the errors it gets.

use super::*;
use serde_json::json;

fn handler(name: &str, settings: &serde_json::Value) -> HandlerConfig {
    HandlerConfig::from_settings(name, &settings.to_string()).expect("valid settings")
}

fn team(ceilings: CeilingsConfig, topics: Option<&[&str]>, groups: Option<&[&str]>) -> TokenPolicy {
    let patterns = |list: Option<&[&str]>| {
        list.map(|l| l.iter().map(|p| Pattern::parse(p, topic_char).unwrap()).collect())
    };
    TokenPolicy::new(
        "team-a",
        "admin.tokens[1]".into(),
        true,
        ceilings,
        patterns(topics),
        patterns(groups),
    )
}

fn refused(policy: &TokenPolicy, settings: serde_json::Value) -> String {
    policy
        .check(&handler("billing", &settings), &settings)
        .expect_err("refused")
        .0
}

#[test]
fn every_default_fits_under_the_built_in_team_ceilings() {
    let settings = json!({ "topics": ["orders"] });
    team(CeilingsConfig::default(), None, None)
        .check(&handler("billing", &settings), &settings)
        .expect("an upload of only defaults passes a team token");
    for ceiling in CEILINGS {
        if let Some(max) = ceiling.global_max {
            assert!(
                ceiling.team < max,
                "{} is not below the global maximum",
                ceiling.name
            );
        }
    }
}

#[test]
fn a_team_token_is_held_to_the_built_in_ceiling_and_the_message_names_it() {
    let error = refused(
        &team(CeilingsConfig::default(), None, None),
        json!({ "topics": ["orders"], "limits": { "timeout_ms": 600000 } }),
    );
    assert_eq!(
        error,
        "settings.limits.timeout_ms = 600000 is above the ceiling 30000 of token \"team-a\" \
         (admin.tokens[1].ceilings.timeout_ms, built in for team tokens)"
    );
    for (settings, key) in [
        (
            json!({ "limits": { "memory_mb": 4096 } }),
            "settings.limits.memory_mb = 4096",
        ),
        (
            json!({ "batch": { "max_events": 10000 } }),
            "settings.batch.max_events = 10000",
        ),
        (
            json!({ "retry": { "max_attempts": 1000 } }),
            "settings.retry.max_attempts = 1000",
        ),
        (
            json!({ "instances": { "recycle_memory_mb": 4096 } }),
            "settings.instances.recycle_memory_mb",
        ),
    ] {
        let mut settings = settings;
        settings["topics"] = json!(["orders"]);
        let error = refused(&team(CeilingsConfig::default(), None, None), settings);
        assert!(error.starts_with(key), "{error}");
    }
}

#[test]
fn a_configured_ceiling_replaces_the_built_in_one_in_both_directions() {
    let raised = team(
        CeilingsConfig {
            timeout_ms: Some(120_000),
            ..Default::default()
        },
        None,
        None,
    );
    let settings = json!({ "topics": ["orders"], "limits": { "timeout_ms": 120000 } });
    raised
        .check(&handler("billing", &settings), &settings)
        .expect("raised");
    // Below the default: an upload that does not set it is told so.
    let lowered = team(
        CeilingsConfig {
            memory_mb: Some(64),
            ..Default::default()
        },
        None,
        None,
    );
    let error = refused(&lowered, json!({ "topics": ["orders"] }));
    assert_eq!(
        error,
        "settings.limits.memory_mb = 128 (the default: set a lower one in the settings) is above \
         the ceiling 64 of token \"team-a\" (admin.tokens[1].ceilings.memory_mb)"
    );
}

#[test]
fn an_admin_token_is_held_only_to_what_the_operator_set() {
    let settings = json!({
        "topics": ["anything"], "group_id": "someone-elses",
        "limits": { "timeout_ms": 600000, "memory_mb": 4096 },
    });
    let handler = handler("billing", &settings);
    TokenPolicy::unrestricted("ops")
        .check(&handler, &settings)
        .expect("no ceilings");
    let capped = TokenPolicy::new(
        "ops",
        "admin.tokens[0]".into(),
        false,
        CeilingsConfig {
            memory_mb: Some(1024),
            ..Default::default()
        },
        None,
        None,
    );
    let error = capped.check(&handler, &settings).expect_err("memory").0;
    assert!(error.contains("admin.tokens[0].ceilings.memory_mb)"), "{error}");
}

#[test]
fn topics_and_outbox_targets_must_match_the_allowlist() {
    let policy = team(CeilingsConfig::default(), Some(&["orders", "billing.*"]), None);
    let ok =
        json!({ "topics": ["orders", "billing.retries"], "outbox_topics": { "out": "billing.invoices" } });
    policy.check(&handler("billing", &ok), &ok).expect("allowed");
    let error = refused(&policy, json!({ "topics": ["orders", "payments"] }));
    assert_eq!(
        error,
        "settings.topics: topic \"payments\" is not allowed for token \"team-a\" \
         (admin.tokens[1].topics = [\"orders\", \"billing.*\"])"
    );
    let error = refused(
        &policy,
        json!({ "topics": ["orders"], "outbox_topics": { "invoices": "payments.invoices" } }),
    );
    assert!(
        error.starts_with("settings.outbox_topics.invoices: topic \"payments.invoices\""),
        "{error}"
    );
    // A prefix is a prefix of the name, not a glob in the middle.
    let error = refused(&policy, json!({ "topics": ["billing"] }));
    assert!(error.contains("\"billing\" is not allowed"), "{error}");
}

#[test]
fn a_team_token_uses_only_groups_in_its_handlers_namespace() {
    let policy = team(CeilingsConfig::default(), None, None);
    for group in ["inboxd.billing", "inboxd.billing.blue"] {
        let settings = json!({ "topics": ["o"], "group_id": group });
        policy
            .check(&handler("billing", &settings), &settings)
            .expect(group);
    }
    let settings = json!({ "topics": ["o"] });
    policy
        .check(&handler("billing", &settings), &settings)
        .expect("default group");
    for group in [
        "inboxd.notifier",
        "inboxd.billing_x",
        "inboxd.billingx",
        "payments-service",
    ] {
        let error = refused(&policy, json!({ "topics": ["o"], "group_id": group }));
        assert!(
            error.starts_with(&format!(
                "settings.group_id = {group:?} is not allowed for token \"team-a\""
            )),
            "{error}"
        );
    }
    // The operator may grant more.
    let granted = team(CeilingsConfig::default(), None, Some(&["legacy-billing"]));
    let settings = json!({ "topics": ["o"], "group_id": "legacy-billing" });
    granted
        .check(&handler("billing", &settings), &settings)
        .expect("granted");
}

#[test]
fn patterns_allow_a_trailing_star_only() {
    assert!(
        Pattern::parse("team_a.*", topic_char)
            .unwrap()
            .matches("team_a.x")
    );
    assert!(Pattern::parse("*", topic_char).unwrap().matches("anything"));
    assert!(!Pattern::parse("orders", topic_char).unwrap().matches("orders2"));
    for bad in ["", "a*b", "*.orders", "or ders", "a/b"] {
        assert!(Pattern::parse(bad, topic_char).is_err(), "{bad:?}");
    }
}

/// Regression (the review of the eighteenth adversarial read, issue 23):
/// id names other than `event_id` reach every message to the handler's
/// topics, so a team token may not choose them; an admin token may.
#[test]
fn a_team_token_keeps_the_default_id_names() {
    for settings in [
        json!({ "topics": ["orders"], "event_id": { "header": "content-type" } }),
        json!({ "topics": ["orders"], "event_id": { "json_field": "amount" } }),
    ] {
        let err = refused(&team(CeilingsConfig::default(), None, None), settings.clone());
        assert!(err.contains("only an operator"), "{err}");
        TokenPolicy::unrestricted("ops")
            .check(&handler("billing", &settings), &settings)
            .expect("an admin token may choose the names");
    }
    let default = json!({ "topics": ["orders"], "event_id": { "source": "json", "format": "any" } });
    team(CeilingsConfig::default(), None, None)
        .check(&handler("billing", &default), &default)
        .expect("the other event_id keys are the team's");
}
