//! A small run of the benchmark, so it cannot rot: every mode (the Python
//! and JavaScript guests' too) on both
//! backends, a few hundred records, and the report checked. It measures
//! nothing worth keeping (the machine is shared); the numbers come from
//! `scripts/bench`.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the suite with scripts/test"))
}

#[test]
fn a_small_benchmark_run_reports_every_mode_with_exact_effects() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO_BIN_EXE_inboxd-bench"))
        .args([
            "--events",
            "600",
            "--rate",
            "300",
            "--live-secs",
            "1",
            "--timeout-secs",
            "120",
            "--modes",
            "plain,po,a,b,c,d,py,js,kp,kk",
            "--keyed-events",
            "300",
        ])
        .env("INBOXD_BENCH_BROKERS", env("INBOXD_TEST_BROKERS"))
        .env("INBOXD_BENCH_POSTGRES", env("INBOXD_TEST_POSTGRES"))
        .env(
            "INBOXD_BENCH_COMPONENT",
            repo.join("guests/target/wasm32-wasip2/release/billing.wasm"),
        )
        .env("INBOXD_BENCH_MIGRATIONS", repo.join("guests/billing/migrations"))
        .output()
        .expect("run inboxd-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the benchmark failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a report line");
    let report: Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(report["records"], 600);
    let ceiling = report["broker_only_records_per_s"].as_f64();
    assert!(
        ceiling.is_some_and(|c| c > 0.0),
        "the broker-only ceiling: {report}"
    );
    for backend in ["sqlite", "postgres"] {
        let mut host_cpu_total = 0.0;
        for mode in ["plain", "po", "a", "b", "c", "d", "py", "js"] {
            let m = &report[backend][mode];
            assert_eq!(m["effects_exact"], true, "{backend} {mode}: {m}\n{stderr}");
            assert!(m["events_per_s"].as_f64().unwrap() > 0.0, "{backend} {mode}: {m}");
            assert!(m["peak_rss_mib"].as_f64().unwrap() > 0.0, "{backend} {mode}: {m}");
            assert!(m["half_rate"].as_f64().unwrap() > 0.0, "{backend} {mode}: {m}");
            assert!(m["half_rate_p99_ms"].as_f64().is_some(), "{backend} {mode}: {m}");
            let host_cpu = m["cpu_per_event"]["host_cpu_us"].as_f64().unwrap();
            // CPU time comes in 10 ms ticks, and one mode's 600 records may
            // take less than one (PostgreSQL's mode d did, in 43 ms): the
            // modes' hosts together spend several.
            assert!(host_cpu >= 0.0, "{backend} {mode}: {m}");
            if !mode.starts_with('p') {
                host_cpu_total += host_cpu;
            }
            assert!(
                m["cpu_per_event"]["postgres_cpu_us"].as_f64().is_some(),
                "{backend} {mode}: {m}"
            );
            // Every mode but plain writes an outbox (po too, with a relay of
            // its own), and is done once its relay has drained.
            let drained = m["relay_drained_after_ms"].as_f64();
            assert_eq!(drained.is_some(), mode != "plain", "{backend} {mode}: {m}");
        }
        assert!(
            host_cpu_total > 0.0,
            "{backend}: no host CPU counted in any mode: {report}"
        );
        assert!(report[backend]["a_over_plain"].as_f64().is_some(), "{report}");
        assert!(report[backend]["c_over_plain"].as_f64().is_some(), "{report}");
        assert!(report[backend]["a_over_po"].as_f64().is_some(), "{report}");
        assert!(report[backend]["a_over_b"].as_f64().is_some(), "{report}");
        assert!(report[backend]["a_over_c"].as_f64().is_some(), "{report}");
        assert!(report[backend]["py_over_d"].as_f64().is_some(), "{report}");
        assert!(report[backend]["js_over_d"].as_f64().is_some(), "{report}");
        // The order modes: the backlog only, each effect once.
        for mode in ["kp", "kk"] {
            let m = &report[backend][mode];
            assert_eq!(m["effects_exact"], true, "{backend} {mode}: {m}\n{stderr}");
            assert!(m["events_per_s"].as_f64().unwrap() > 0.0, "{backend} {mode}: {m}");
        }
        assert!(report[backend]["kk_over_kp"].as_f64().is_some(), "{report}");
    }
    assert_eq!(report["order_modes"]["records"], 300, "{report}");
}
