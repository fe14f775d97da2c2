//! What the report and its validation must keep doing: figures placed
//! where a reader looks for them, and broken runs refused.

use super::*;

#[test]
fn summary_takes_the_middle_of_an_even_count() {
    assert_eq!(summary(&[]), None);
    assert_eq!(summary(&[3.0, 1.0, 2.0]), Some((1.0, 2.0, 3.0)));
    assert_eq!(summary(&[4000.0, 3000.0]), Some((3000.0, 3500.0, 4000.0)));
}

#[test]
fn quiet_waits_are_reported_with_every_probe() {
    let r = Results {
        quiet_waits: vec![
            QuietWait {
                before: "sqlite metering, 0 ms upstream".into(),
                probe_p99_us: vec![1250.0, 480.0],
                probe_sync_p99_us: vec![2100.0, 310.0],
                quiet: true,
                waited_s: 14.2,
            },
            QuietWait {
                before: "off metering, 0 ms upstream".into(),
                probe_p99_us: vec![900.0],
                probe_sync_p99_us: vec![400.0],
                quiet: false,
                waited_s: 2.1,
            },
        ],
        ..Results::default()
    };
    let md = markdown(&r);
    assert!(
        md.contains("| sqlite metering, 0 ms upstream | 1.25, 0.48 | 2.10, 0.31 | yes | 14 |"),
        "{md}"
    );
    assert!(md.contains("| 0.90 | 0.40 | no (gave up) | 2 |"), "{md}");
    let back: Results = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.quiet_waits, r.quiet_waits);

    // Asked for, but a server's steps ran without a probe.
    let mut asked = Results {
        schema_version: SCHEMA_VERSION,
        machine: Some(crate::sys::machine()),
        settings: serde_json::json!({"wait_quiet": {"max_wait_s": 1, "p99_ms": 0.5, "sync_p99_ms": 0.5}}),
        steps: vec![Step {
            sent: 10,
            ok: 10,
            ..Step::default()
        }],
        groups: vec![
            Group {
                purpose: "load".into(),
                ..Group::default()
            };
            3
        ],
        quiet_waits: r.quiet_waits.clone(),
        ..Results::default()
    };
    let err = validate(&serde_json::to_string(&asked).unwrap(), true).unwrap_err();
    assert!(
        err.to_string().contains("2 quiet waits for 3 servers"),
        "{err}"
    );
    asked.groups.pop();
    validate(&serde_json::to_string(&asked).unwrap(), true).unwrap();
    // A probe of the cores without its disk probe.
    asked.quiet_waits[0].probe_sync_p99_us.pop();
    let err = validate(&serde_json::to_string(&asked).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("disk probe"), "{err}");
    asked.quiet_waits[1].probe_p99_us.clear();
    assert!(validate(&serde_json::to_string(&asked).unwrap(), true).is_err());
}

#[test]
fn paired_rounds_are_summarized_per_metering_mode_and_validated() {
    let pair = |metering: &str, round: u32, direct_p99: f64, orchestrator_p99: f64| {
        let q = |p50: f64, p99: f64| Quantiles {
            p50,
            p90: p99,
            p99,
            p999: p99,
            ..Quantiles::default()
        };
        let step = |via: &str, latency_us: Quantiles| Step {
            kind: "paired".into(),
            rpc: "Execute".into(),
            via: via.into(),
            metering: metering.into(),
            offered_rps: 1000.0,
            sent: 5000,
            ok: 5000,
            latency_us,
            ..Step::default()
        };
        let direct = step("direct", q(200.0, direct_p99));
        let sync = |p99: f64| ServerHistogram {
            p99,
            ..ServerHistogram::default()
        };
        let mut orchestrator = step("orchestrator", q(500.0, orchestrator_p99));
        orchestrator.added_latency_us = Some(orchestrator.latency_us.minus(&direct.latency_us));
        if metering == "sqlite" {
            orchestrator.ledger = Some(LedgerView {
                sync_us: Some(sync(200.0 + f64::from(round) * 100.0)),
                ..LedgerView::default()
            });
        }
        Pair {
            metering: metering.into(),
            rpc: "Execute".into(),
            round,
            direct_first: round.is_multiple_of(2),
            direct,
            orchestrator,
        }
    };
    let mut r = Results {
        schema_version: SCHEMA_VERSION,
        machine: Some(crate::sys::machine()),
        settings: serde_json::json!({
            "paired": {"rounds": 3, "rate": 1000.0, "duration_s": 5.0},
            "upstream_latency_ms": [0, 50],
        }),
        groups: ["sqlite", "off", "postgres"]
            .into_iter()
            .flat_map(|metering| {
                [0, 50].map(|upstream_latency_ms| Group {
                    purpose: "load".into(),
                    metering: metering.into(),
                    upstream_latency_ms,
                    // PostgreSQL was not there: no rounds expected.
                    skipped: (metering == "postgres").then(|| "no database".into()),
                    ..Group::default()
                })
            })
            .collect(),
        paired: vec![
            pair("sqlite", 0, 400.0, 1300.0),
            pair("sqlite", 1, 2000.0, 2800.0),
            pair("sqlite", 2, 500.0, 2100.0),
            pair("off", 0, 400.0, 700.0),
            pair("off", 1, 400.0, 800.0),
            pair("off", 2, 300.0, 600.0),
        ],
        ..Results::default()
    };
    let s = paired_summary(&r, "sqlite", 1000.0).unwrap();
    assert_eq!(s.added_p99_us, vec![900.0, 800.0, 1600.0]);
    assert_eq!(s.median_added_p99_us, 900.0);
    assert_eq!(s.rounds_within, 2);
    assert_eq!(s.median_added_p50_us, 300.0);
    assert_eq!(s.direct_p99_us, (400.0, 2000.0));
    assert_eq!(s.wal_sync_p99_us, Some((200.0, 400.0)));
    assert_eq!(
        paired_summary(&r, "off", 1000.0).unwrap().wal_sync_p99_us,
        None
    );
    assert_eq!(paired_summary(&r, "postgres", 1000.0), None);

    let json = serde_json::to_string(&r).unwrap();
    // Not strict: these steps carry no ledger figures.
    let back = validate(&json, false).unwrap();
    let md = markdown(&back);
    assert!(
        md.contains(
            "| sqlite | 3 | 0.90, 0.80, 1.60 | **0.90** | 2 of 3 | 0.30 | 0.40–2.00 | 0.20–0.40 |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| off | 3 | 0.30, 0.40, 0.30 | **0.30** | 3 of 3 | 0.30 | 0.30–0.40 | – |"),
        "{md}"
    );

    // A mode that stopped early, or a round without its difference.
    r.paired.pop();
    let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
    assert!(
        err.to_string()
            .contains("off metering ran 2 paired rounds, not 3"),
        "{err}"
    );
    // A server that ran fixed rates but no rounds at all.
    let all = std::mem::take(&mut r.paired);
    r.paired = all
        .iter()
        .filter(|p| p.metering == "sqlite")
        .cloned()
        .collect();
    let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
    assert!(
        err.to_string()
            .contains("off metering ran 0 paired rounds, not 3"),
        "{err}"
    );
    r.paired = all;
    r.paired.push(pair("off", 2, 300.0, 600.0));
    validate(&serde_json::to_string(&r).unwrap(), false).unwrap();
    // Added latency against another step than the round's own.
    let honest = r.paired[0].orchestrator.added_latency_us;
    r.paired[0].orchestrator.added_latency_us = r.paired[1].orchestrator.added_latency_us;
    let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
    assert!(
        err.to_string().contains("not orchestrator minus direct"),
        "{err}"
    );
    r.paired[0].orchestrator.added_latency_us = honest;
    r.paired[0].direct.rpc = "ClassifySms".into();
    let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
    assert!(err.to_string().contains("mixes RPCs or rates"), "{err}");
    r.paired[0].direct.rpc = "Execute".into();
    r.paired[0].orchestrator.added_latency_us = None;
    let err = validate(&serde_json::to_string(&r).unwrap(), false).unwrap_err();
    assert!(
        err.to_string().contains("without its added latency"),
        "{err}"
    );
}

#[test]
fn validation_rejects_runs_where_everything_failed() {
    let mut r = Results {
        schema_version: SCHEMA_VERSION,
        machine: Some(crate::sys::machine()),
        ..Results::default()
    };
    assert!(
        validate(&serde_json::to_string(&r).unwrap(), false).is_err(),
        "no steps"
    );
    r.steps.push(Step {
        sent: 10,
        errors: 10,
        ..Step::default()
    });
    assert!(
        validate(&serde_json::to_string(&r).unwrap(), false).is_err(),
        "all failed"
    );
    r.steps[0].ok = 5;
    r.steps[0].errors = 5;
    let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
    assert_eq!(back.steps.len(), 1);
    assert!(markdown(&back).contains("Fixed rates"));

    // A metered orchestrator step must carry what its ledger did.
    let mut metered = r.clone();
    metered.steps[0].via = "orchestrator".into();
    metered.steps[0].metering = "sqlite".into();
    let err = validate(&serde_json::to_string(&metered).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("no ledger figures"), "{err}");
    let wait = ServerHistogram {
        count: 5.0,
        mean: 400.0,
        p50: 300.0,
        p99: 1200.0,
    };
    metered.steps[0].ledger = Some(LedgerView {
        reserve_wait_us: Some(wait),
        settle_wait_us: Some(wait),
        ops_per_commit: Some(1.0),
        ..LedgerView::default()
    });
    let back = validate(&serde_json::to_string(&metered).unwrap(), true).unwrap();
    assert!(
        markdown(&back).contains("| sqlite | 0 | 0 | 0.30 / 1.20 | 0.30 / 1.20 | – | – | 1.0 |"),
        "{}",
        markdown(&back)
    );
    // An agent turn's calls do not wait for their settlements (its end
    // does): commits alone are its ledger's figures; not so for Execute.
    let commits_only = Some(LedgerView {
        commit_us: Some(wait),
        ..LedgerView::default()
    });
    metered.steps[0].ledger = commits_only;
    let err = validate(&serde_json::to_string(&metered).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("no ledger figures"), "{err}");
    metered.steps[0].rpc = "Converse".into();
    validate(&serde_json::to_string(&metered).unwrap(), true).unwrap();
    metered.steps[0].metering = "off".into();
    metered.steps[0].ledger = None;
    validate(&serde_json::to_string(&metered).unwrap(), true).unwrap();
    assert!(validate("{\"schema_version\": 1}", false).is_err());

    // Two sweeps asked for, one recorded: the repeat did not run.
    r.settings = serde_json::json!({"saturation": {"repeats": 2}});
    let sweep = |repeat| Saturation {
        metering: "sqlite".into(),
        repeat,
        rpc: "Execute".into(),
        highest_passing_rps: Some(3000.0),
        ..Saturation::default()
    };
    r.saturation = vec![sweep(0)];
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 Execute saturation sweeps, not 2"),
        "{err}"
    );
    r.saturation.push(sweep(1));
    let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
    assert!(
        markdown(&back)
            .contains("| sqlite | Execute | 3000, 3000 | **3000** | none failed; none failed |"),
        "{}",
        markdown(&back)
    );

    // Calls past an open breaker never reach the broken provider.
    r.breaker = Some(Breaker {
        broken_upstream_calls_while_open: 3,
        ..Breaker::default()
    });
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(
        err.to_string().contains("while its breaker was open"),
        "{err}"
    );
}

#[test]
fn refused_calls_are_reported_side_by_side_and_validated() {
    let refused = |metering: &str, p99: f64| Refused {
        metering: metering.into(),
        broken_upstream_calls: 0,
        step: Step {
            kind: "refused".into(),
            rpc: "Execute".into(),
            via: "orchestrator".into(),
            metering: metering.into(),
            callers: 200,
            sent: 4000,
            ok: 4000,
            achieved_rps: 8000.0,
            latency_us: Quantiles {
                p50: 300.0,
                p90: 500.0,
                p99,
                p999: p99,
                ..Quantiles::default()
            },
            // The refusals' records are committed; nobody waited for them.
            ledger: (metering == "sqlite").then(|| LedgerView {
                commit_us: Some(ServerHistogram::default()),
                ..LedgerView::default()
            }),
            ..Step::default()
        },
    };
    let server = |metering: &str| Group {
        purpose: "breaker".into(),
        metering: metering.into(),
        ..Group::default()
    };
    let mut r = Results {
        schema_version: SCHEMA_VERSION,
        machine: Some(crate::sys::machine()),
        groups: vec![server("sqlite"), server("off")],
        breaker: Some(Breaker {
            refused: vec![refused("sqlite", 1900.0), refused("off", 1700.0)],
            ..Breaker::default()
        }),
        ..Results::default()
    };
    let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
    let md = markdown(&back);
    assert!(
        md.contains("| sqlite | 200 | 4000 | 8000 | 0 | 0.30 | **1.90** | 1.90 | – | 0 |"),
        "{md}"
    );
    assert!(
        md.contains("| off | 200 | 4000 | 8000 | 0 | 0.30 | **1.70** |"),
        "{md}"
    );

    // A refusal that reached the provider is not a fast failure.
    r.breaker.as_mut().unwrap().refused[1].broken_upstream_calls = 2;
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("2 provider calls"), "{err}");
    // A breaker server that measured no refused calls.
    r.breaker.as_mut().unwrap().refused.pop();
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(
        err.to_string()
            .contains("off server measured no refused calls"),
        "{err}"
    );
    // A metered server whose refusals left no commit behind.
    r.groups.pop();
    r.breaker.as_mut().unwrap().refused[0].step.ledger = None;
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("no ledger figures"), "{err}");
}

#[test]
fn a_run_of_the_usage_scenario_alone_is_valid_and_an_empty_run_is_not() {
    let mut r = Results {
        schema_version: SCHEMA_VERSION,
        machine: Some(crate::sys::machine()),
        ..Results::default()
    };
    let err = validate(&serde_json::to_string(&r).unwrap(), true).unwrap_err();
    assert!(err.to_string().contains("no load steps"), "{err}");
    r.usage.push(UsageRead {
        metering: "sqlite".into(),
        records: 1_000_000,
        group_by: "totals".into(),
        calls: 20,
        p95_ms: 4.4,
        ..UsageRead::default()
    });
    let back = validate(&serde_json::to_string(&r).unwrap(), true).unwrap();
    assert!(markdown(&back).contains("GetUsage"), "{}", markdown(&back));
}

#[test]
fn cluster_rounds_are_compared_by_their_medians() {
    let round = |n: u32, on: bool, p50_us: f64, sat: f64| ClusterRound {
        round: n,
        cluster: on,
        step: Step {
            via: "orchestrator".into(),
            rpc: "Execute".into(),
            metering: "off".into(),
            sent: 1000,
            ok: 1000,
            achieved_rps: 1000.0,
            latency_us: Quantiles {
                p50: p50_us,
                p90: p50_us,
                p99: p50_us,
                p999: p50_us,
                ..Quantiles::default()
            },
            ..Step::default()
        },
        cpu_s_per_1k_both: Some(0.5),
        redis_cpu_s_per_1k: on.then_some(0.1),
        saturation: Saturation {
            highest_passing_rps: Some(sat),
            ..Saturation::default()
        },
    };
    let r = Results {
        cluster: vec![
            round(0, false, 1000.0, 4000.0),
            round(1, true, 1200.0, 3600.0),
            round(2, true, 1400.0, 3400.0),
            round(3, false, 1000.0, 4000.0),
        ],
        ..Results::default()
    };
    let md = markdown(&r);
    // Medians: 3,500 / 4,000 and 1.3 ms − 1.0 ms.
    assert!(md.contains("**0.88×** without"), "{md}");
    assert!(md.contains("**+0.30 ms**"), "{md}");
    assert!(
        md.contains("| 2 | on | 1000 | 1.20 | 1.20 | 0.500 | 0.100 | 3600 |"),
        "{md}"
    );
}
