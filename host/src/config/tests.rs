//! Config parsing and validation: defaults, and errors that name the key.
use super::*;

fn with_component(extra: &str) -> String {
    format!(
        r#"
        [kafka]
        brokers = "127.0.0.1:9092"
        [[handlers]]
        name = "billing"
        component = "{}"
        topics = ["orders"]
        {extra}
        "#,
        file!().replace('\\', "/")
    )
}

fn load(text: &str) -> Result<Config, String> {
    // Tests run in the crate folder; file!() is relative to the workspace root.
    let config = Config::parse(text)?;
    let mut config = config;
    config.resolve_paths(Path::new(".."));
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[test]
fn minimal_config_gets_the_documented_defaults() {
    let config = load(&with_component("")).unwrap();
    assert_eq!(config.database.url, defaults::DATABASE_URL);
    let handler = &config.handlers[0];
    assert_eq!(handler.group_id(), "inboxd.billing");
    assert_eq!(handler.limits.timeout_ms, defaults::TIMEOUT_MS);
    assert_eq!(handler.event_id.header, "event_id");
    assert_eq!(config.wasm.compile_cpu_seconds, 60);
    assert_eq!(config.wasm.compile_memory_mb, 2048);
    assert_eq!(config.wasm.instances, 256);
}

#[test]
fn unknown_key_is_named() {
    let err = load(&with_component("colour = \"blue\"")).unwrap_err();
    assert!(err.contains("unknown field `colour`"), "{err}");
}

#[test]
fn unknown_nested_key_is_named() {
    let err = load(&with_component("[handlers.limits]\ntimeout = 5")).unwrap_err();
    assert!(err.contains("unknown field `timeout`"), "{err}");
}

#[test]
fn bad_values_name_their_key() {
    let cases = [
        (
            "[handlers.limits]\ntimeout_ms = 0",
            "handlers[0].limits.timeout_ms",
        ),
        ("[handlers.limits]\nmemory_mb = 0", "handlers[0].limits.memory_mb"),
        (
            "[handlers.retry]\nmax_attempts = 0",
            "handlers[0].retry.max_attempts",
        ),
        ("[handlers.batch]\nmax_events = 0", "handlers[0].batch.max_events"),
        (
            "[handlers.instances]\nrecycle_memory_mb = 0",
            "handlers[0].instances.recycle_memory_mb",
        ),
        (
            "[handlers.instances]\nrecycle_after_events = 0",
            "handlers[0].instances.recycle_after_events",
        ),
        (
            "[handlers.batch]\nlinger_ms = 60000",
            "handlers[0].batch.linger_ms",
        ),
        (
            "group_id = \"x\"\nmigrations = \"/nonexistent\"",
            "handlers[0].migrations",
        ),
        ("[wasm]\ncompile_cpu_seconds = 0", "wasm.compile_cpu_seconds"),
        ("[wasm]\ncompile_memory_mb = 100", "wasm.compile_memory_mb"),
        // On SQLite (the forty-third read): SQLite's sorter at larger rows.
        (
            "[handlers.limits]\nmax_row_bytes = 2097152",
            "handlers[0].limits.max_row_bytes",
        ),
        ("[wasm]\ninstances = 0", "wasm.instances"),
        ("[wasm]\ninstances = 5000", "wasm.instances"),
    ];
    for (extra, key) in cases {
        let err = load(&with_component(extra)).unwrap_err();
        assert!(err.contains(&format!("`{key}`")), "expected {key} in: {err}");
    }
}

/// The instance pool must hold every handler's calls at once (the
/// forty-fourth read, issue 23; see `instances_short`): on PostgreSQL one
/// per connection of each handler's own, on SQLite one.
#[test]
fn a_pool_that_cannot_hold_every_handlers_calls_is_refused() {
    let on_postgres = |extra: &str| {
        with_component(extra).replace(
            "[kafka]",
            "[database]\nurl = \"postgres://inboxd@127.0.0.1/inboxd\"\nmax_connections = 8\n[kafka]",
        )
    };
    assert!(load(&on_postgres("[wasm]\ninstances = 8")).is_ok());
    let err = load(&on_postgres("[wasm]\ninstances = 7")).unwrap_err();
    assert!(
        err.contains("`wasm.instances`") && err.contains("need 8 Wasm instances"),
        "{err}"
    );
    assert!(load(&with_component("[wasm]\ninstances = 1")).is_ok());
    assert_eq!(instances_short(3, 8, 24), None);
    assert!(instances_short(4, 8, 24).is_some_and(|why| why.contains("4 handlers")));
}

#[test]
fn bad_handler_name_and_missing_component_are_named() {
    let text = with_component("").replace("\"billing\"", "\"Billing-1\"");
    assert!(load(&text).unwrap_err().contains("`handlers[0].name`"));
    let text = with_component("").replace("tests.rs", "missing.wasm");
    assert!(load(&text).unwrap_err().contains("`handlers[0].component`"));
}

#[test]
fn wrong_type_and_bad_enum_are_parse_errors_naming_the_key() {
    let err = load(&with_component("topics = 3")).unwrap_err();
    assert!(err.contains("topics"), "{err}");
    let err = load(&with_component("[handlers.event_id]\nsource = \"cookie\"")).unwrap_err();
    assert!(err.contains("cookie") && err.contains("source"), "{err}");
}

#[test]
fn inbox_retention_parses_durations_and_names_bad_ones() {
    let text = with_component("").replace("[[handlers]]", "[inbox]\nretention = \"36h\"\n[[handlers]]");
    assert_eq!(
        load(&text).unwrap().inbox.retention,
        Duration::from_secs(36 * 3600)
    );
    assert_eq!(
        load(&with_component("")).unwrap().inbox.retention,
        Duration::from_secs(14 * 86_400)
    );
    let text = with_component("").replace("[[handlers]]", "[inbox]\nretention = \"two weeks\"\n[[handlers]]");
    let err = load(&text).unwrap_err();
    assert!(
        err.contains("retention") && err.contains("not a duration"),
        "{err}"
    );
    let text = with_component("").replace("[[handlers]]", "[inbox]\npartitioning = \"daily\"\n[[handlers]]");
    assert!(load(&text).unwrap_err().contains("`inbox.partitioning`"));
}

#[test]
fn reserved_kafka_property_is_refused() {
    let text = with_component("").replace(
        "brokers = \"127.0.0.1:9092\"",
        "brokers = \"127.0.0.1:9092\"\nproperties = { \"enable.auto.commit\" = \"true\" }",
    );
    let err = load(&text).unwrap_err();
    assert!(err.contains("kafka.properties.\"enable.auto.commit\""), "{err}");
}

#[test]
fn an_offset_reset_that_skips_records_is_refused() {
    let with_reset = |value: &str| {
        with_component("").replace(
            "brokers = \"127.0.0.1:9092\"",
            &format!("brokers = \"127.0.0.1:9092\"\nproperties = {{ \"auto.offset.reset\" = \"{value}\" }}"),
        )
    };
    for skipping in ["latest", "largest", "end", "error"] {
        let err = load(&with_reset(skipping)).unwrap_err();
        assert!(
            err.contains("kafka.properties.\"auto.offset.reset\"") && err.contains("skip"),
            "{skipping}: {err}"
        );
    }
    assert!(load(&with_reset("earliest")).is_ok());
}

#[test]
fn env_overrides_database_and_brokers() {
    let mut config = load(&with_component("")).unwrap();
    config.apply_env(|k| match k {
        "INBOXD_DATABASE_URL" => Some("postgres://h/db".into()),
        "INBOXD_KAFKA_BROKERS" => Some("b:1".into()),
        _ => None,
    });
    assert_eq!(config.database.url, "postgres://h/db");
    assert_eq!(config.kafka.brokers, "b:1");
}

#[test]
fn duplicate_handler_names_are_refused() {
    let one = with_component("");
    let handler = &one[one.find("[[handlers]]").unwrap()..];
    let err = load(&format!("{one}\n{handler}")).unwrap_err();
    assert!(err.contains("declared twice"), "{err}");
}

fn with_admin(admin: &str) -> Result<Config, String> {
    let text = format!("[kafka]\nbrokers = \"127.0.0.1:9092\"\n[admin]\n{admin}\n");
    let mut config = Config::parse(&text)?;
    config.apply_env(|key| (key == "TEAM_TOKEN").then(|| "from-the-environment-123".to_owned()));
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[test]
fn admin_tokens_are_validated_and_read_from_the_environment() {
    let ok = with_admin(
        "[[admin.tokens]]\nname = \"ops\"\ntoken = \"0123456789abcdef\"\nadmin = true\n\
         [[admin.tokens]]\nname = \"team\"\ntoken_env = \"TEAM_TOKEN\"\nhandlers = [\"billing\"]",
    )
    .unwrap();
    let admin = ok.admin.expect("admin section");
    assert_eq!(admin.listen, defaults::ADMIN_LISTEN);
    assert_eq!(admin.tokens[1].token.as_deref(), Some("from-the-environment-123"));
    assert!(
        !format!("{admin:?}").contains("0123456789abcdef"),
        "Debug hides secrets"
    );

    let cases = [
        ("", "admin.tokens"),
        (
            "[[admin.tokens]]\nname = \"a\"\ntoken = \"short\"\nadmin = true",
            "at least 16",
        ),
        (
            "[[admin.tokens]]\nname = \"a\"\ntoken_env = \"UNSET_VAR\"\nadmin = true",
            "UNSET_VAR",
        ),
        (
            "[[admin.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"",
            "exactly one of",
        ),
        (
            "[[admin.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nhandlers = [\"Bad-Name\"]",
            "Bad-Name",
        ),
        (
            "listen = \"localhost\"\n[[admin.tokens]]\nname = \"a\"\ntoken = \"0123456789abcdef\"\nadmin = true",
            "admin.listen",
        ),
    ];
    for (admin, says) in cases {
        let err = with_admin(admin).unwrap_err();
        assert!(err.contains(says), "{admin:?}: {err}");
    }
}

#[test]
fn upload_settings_reuse_the_handler_keys_and_name_the_bad_one() {
    let config = HandlerConfig::from_settings(
        "billing",
        r#"{"topics": ["orders"], "limits": {"timeout_ms": 50}}"#,
    )
    .unwrap();
    assert_eq!(config.limits.timeout_ms, 50);
    assert_eq!(config.group_id(), "inboxd.billing");
    for (settings, says) in [
        (
            r#"{"topics": ["orders"], "component": "x.wasm"}"#,
            "settings.component",
        ),
        (r#"{"topics": ["orders"], "colour": 1}"#, "colour"),
        (r#"{"topics": []}"#, "settings.topics"),
        ("[1]", "JSON object"),
        // Regression (the eighteenth adversarial read, issue 23): the host
        // writes these names on every message to the handler's topics.
        (
            r#"{"topics": ["o"], "event_id": {"header": "a b"}}"#,
            "`settings.event_id.header` must be 1 to 64 printable ASCII characters",
        ),
        (
            &format!(
                r#"{{"topics": ["o"], "event_id": {{"json_field": "{}"}}}}"#,
                "x".repeat(65)
            ),
            "`settings.event_id.json_field` must be 1 to 64",
        ),
        // Regression (issue 23): topic names were unbounded, and copied
        // onto every message (1 MiB x 1,000 messages: 1 GiB per event).
        (
            &format!(r#"{{"topics": ["{}"]}}"#, "o".repeat(250)),
            "is 250 bytes, starting \"oooo",
        ),
        (
            &format!(
                r#"{{"topics": ["o"], "outbox_topics": {{"a": "{}"}}}}"#,
                "t".repeat(1 << 20)
            ),
            "is 1048576 bytes",
        ),
        (
            &format!(
                r#"{{"topics": [{}]}}"#,
                (0..257)
                    .map(|i| format!("\"t{i}\""))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "`settings.topics` has 257 entries; at most 256",
        ),
    ] {
        let err = HandlerConfig::from_settings("billing", settings)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{settings}: {err}");
    }
    let err = HandlerConfig::from_settings("Bad", r#"{"topics": ["o"]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`name`"), "{err}");
}

#[test]
fn two_config_handlers_cannot_share_a_consumer_group() {
    let one = with_component("");
    let other = one[one.find("[[handlers]]").unwrap()..].replace("\"billing\"", "\"notifier\"");
    // The default groups differ (inboxd.billing, inboxd.notifier).
    load(&format!("{one}\n{other}")).unwrap();
    let err = load(&format!("{one}\n{other}group_id = \"inboxd.billing\"\n")).unwrap_err();
    assert!(
        err.contains("`handlers[1].group_id`")
            && err.contains("\"inboxd.billing\" is also the consumer group of handler \"billing\""),
        "{err}"
    );
    let err = load(&with_component("group_id = \" \"")).unwrap_err();
    assert!(err.contains("`handlers[0].group_id`"), "{err}");
}

const TEAM: &str = "[[admin.tokens]]\nname = \"ops\"\ntoken = \"0123456789abcdef\"\nadmin = true\n\
                    [[admin.tokens]]\nname = \"team\"\ntoken = \"fedcba9876543210\"\nhandlers = [\"billing\"]\n";

#[test]
fn token_ceilings_and_allowlists_parse_and_resolve_into_a_policy() {
    let config = with_admin(&format!(
        "{TEAM}topics = [\"orders\", \"billing.*\"]\ngroup_ids = [\"legacy-billing\"]\n\
         [admin.tokens.ceilings]\ntimeout_ms = 60000\nmax_events = 2000\nlinger_ms = 0\n"
    ))
    .unwrap();
    let token = &config.admin.expect("admin").tokens[1];
    assert_eq!(token.ceilings.timeout_ms, Some(60_000));
    assert_eq!(
        token.ceilings.memory_mb, None,
        "unset: the built-in ceiling applies"
    );
    let policy = token.policy(1);
    let settings = serde_json::json!({
        "topics": ["billing.orders"], "group_id": "legacy-billing",
        "limits": { "timeout_ms": 60000 }, "batch": { "max_events": 2000, "linger_ms": 0 },
    });
    let handler = HandlerConfig::from_settings("billing", &settings.to_string()).unwrap();
    policy
        .check(&handler, &settings)
        .expect("at the configured ceilings");
    let settings = serde_json::json!({ "topics": ["orders"], "limits": { "memory_mb": 1024 } });
    let handler = HandlerConfig::from_settings("billing", &settings.to_string()).unwrap();
    let refused = policy.check(&handler, &settings).unwrap_err().to_string();
    assert!(
        refused.contains("(admin.tokens[1].ceilings.memory_mb, built in for team tokens)"),
        "{refused}"
    );
}

#[test]
fn bad_ceilings_and_patterns_name_their_key() {
    let cases = [
        (
            "[admin.tokens.ceilings]\ntimeout_ms = 600001",
            "`admin.tokens[1].ceilings.timeout_ms` must be between 1 and 600000",
        ),
        (
            "[admin.tokens.ceilings]\nmemory_mb = 0",
            "`admin.tokens[1].ceilings.memory_mb`",
        ),
        (
            "[admin.tokens.ceilings]\nmax_events = 10001",
            "`admin.tokens[1].ceilings.max_events`",
        ),
        (
            "[admin.tokens.ceilings]\nmax_rows = 0",
            "`admin.tokens[1].ceilings.max_rows` must be at least 1",
        ),
        ("[admin.tokens.ceilings]\ntimeout = 5", "unknown field `timeout`"),
        ("[admin.tokens.ceilings]\ntimeout_ms = -1", "timeout_ms"),
        ("topics = [\"team_*.orders\"]", "`admin.tokens[1].topics`"),
        ("topics = [\"\"]", "`admin.tokens[1].topics`"),
        ("topics = [\"a b\"]", "`admin.tokens[1].topics`"),
        ("topics = []", "`admin.tokens[1].topics` must list at least one"),
        ("group_ids = [\"*x\"]", "`admin.tokens[1].group_ids`"),
        ("topicz = [\"a\"]", "unknown field `topicz`"),
        ("tables = [\"bad-name\"]", "`admin.tokens[1].tables`"),
        ("tables = []", "`admin.tokens[1].tables` must list at least one"),
    ];
    for (extra, says) in cases {
        let err = with_admin(&format!("{TEAM}{extra}\n")).unwrap_err();
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

/// Regression (issue 23): on SQLite one team could create first a table name
/// another team's migrations need. Reserved names are one token's alone.
#[test]
fn table_reservations_are_one_tokens_and_may_not_overlap() {
    let three = format!(
        "{TEAM}tables = [\"Invoices\", \"billing_*\"]\n\
         [[admin.tokens]]\nname = \"other\"\ntoken = \"aaaabbbbccccdddd\"\nhandlers = [\"notifier\"]\n"
    );
    let config = with_admin(&three).unwrap();
    let tokens = &config.admin.expect("admin").tokens;
    let reserved: Vec<_> = tokens
        .iter()
        .flat_map(|t| t.table_patterns().into_iter().map(|p| (p, t.name.clone())))
        .collect();
    let policy = |i: usize| {
        let elsewhere = reserved
            .iter()
            .filter(|(_, n)| *n != tokens[i].name)
            .cloned()
            .collect();
        tokens[i].policy(i).with_reservations(elsewhere)
    };
    assert_eq!(policy(2).reserved_by_other("INVOICES"), Some("team"));
    assert_eq!(policy(2).reserved_by_other("billing_audit"), Some("team"));
    assert_eq!(policy(2).reserved_by_other("emails"), None);
    assert_eq!(policy(1).reserved_by_other("billing_audit"), None, "its own");
    for (a, b) in [("billing_*", "billing_x"), ("bill*", "billing_*"), ("t", "t")] {
        let overlapping = format!(
            "{TEAM}tables = [\"{a}\"]\n[[admin.tokens]]\nname = \"other\"\ntoken = \"aaaabbbbccccdddd\"\n\
             handlers = [\"notifier\"]\ntables = [\"{b}\"]\n"
        );
        let err = with_admin(&overlapping).unwrap_err();
        assert!(
            err.contains("overlaps") && err.contains("\"other\""),
            "{a} {b}: {err}"
        );
    }
}

#[test]
fn traces_are_off_by_default_and_their_endpoint_must_be_http() {
    let config = load(&with_component("")).unwrap();
    assert_eq!(config.telemetry.otlp_endpoint, None);
    assert_eq!(config.telemetry.service_name, "inboxd");
    let traced =
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/v1/traces\"\nservice_name = \"billing-eu\"";
    let config = load(&format!("{traced}\n{}", with_component(""))).unwrap();
    assert_eq!(
        config.telemetry.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4318/v1/traces")
    );
    assert_eq!(config.telemetry.service_name, "billing-eu");
    let grpc = "[telemetry]\notlp_endpoint = \"127.0.0.1:4317\"";
    let err = load(&format!("{grpc}\n{}", with_component(""))).unwrap_err();
    assert!(
        err.contains("telemetry.otlp_endpoint") && err.contains("http://"),
        "{err}"
    );
    let err = load(&format!("[telemetry]\nsampling = 1\n{}", with_component(""))).unwrap_err();
    assert!(err.contains("unknown field `sampling`"), "{err}");
}

#[test]
fn a_dedup_section_names_where_its_key_is_and_its_window() {
    let config = load(&with_component(
        "[handlers.dedup]\nkey = \"$.order.id\"\nwindow = \"7d\"",
    ))
    .unwrap();
    let dedup = config.handlers[0].dedup.as_ref().expect("dedup");
    assert_eq!(dedup.json_path(), Some(vec!["order", "id"]));
    assert_eq!(dedup.window, Duration::from_secs(7 * 86_400));
    assert!(load(&with_component("")).unwrap().handlers[0].dedup.is_none());
    let header = load(&with_component(
        "[handlers.dedup]\nheader = \"order-id\"\nwindow = \"1h\"",
    ))
    .unwrap();
    assert_eq!(
        header.handlers[0].dedup.as_ref().unwrap().header.as_deref(),
        Some("order-id")
    );
    for (dedup, key) in [
        ("window = \"1h\"", "`handlers[0].dedup`"),
        (
            "key = \"$.a\"\nheader = \"h\"\nwindow = \"1h\"",
            "`handlers[0].dedup`",
        ),
        ("key = \"order_id\"\nwindow = \"1h\"", "handlers[0].dedup.key"),
        ("key = \"$.a..b\"\nwindow = \"1h\"", "handlers[0].dedup.key"),
        (
            "header = \"order id\"\nwindow = \"1h\"",
            "handlers[0].dedup.header",
        ),
        ("key = \"$.a\"\nwindow = \"0s\"", "handlers[0].dedup.window"),
        ("key = \"$.a\"\nwindow = \"400d\"", "handlers[0].dedup.window"),
    ] {
        let err = load(&with_component(&format!("[handlers.dedup]\n{dedup}"))).unwrap_err();
        assert!(err.contains(key), "{dedup}: {err}");
    }
    let err = load(&with_component("[handlers.dedup]\nkey = \"$.a\"")).unwrap_err();
    assert!(err.contains("missing field `window`"), "{err}");
}

/// Regression (the twenty-third adversarial read, issue 23): the id names a
/// handler registers are looked up by a message's topic, which a pattern
/// subscription (`^orders\..*`) never equals; such a handler takes its id
/// from `event_id`, which the host stamps.
#[test]
fn a_pattern_subscription_takes_its_id_from_event_id() {
    let pattern =
        |extra: &str| with_component(extra).replace(r#"topics = ["orders"]"#, r#"topics = ["^orders\\..*"]"#);
    for extra in [
        "[handlers.event_id]\nheader = \"x-id\"",
        "[handlers.event_id]\njson_field = \"id\"",
    ] {
        let err = load(&pattern(extra)).unwrap_err();
        assert!(
            err.contains("handlers[0].event_id") && err.contains("is a pattern"),
            "{extra}: {err}"
        );
    }
    load(&pattern("")).unwrap();
    load(&with_component("[handlers.event_id]\nheader = \"x-id\"")).unwrap();
}
