use super::*;

#[test]
fn a_database_url_must_name_a_file_or_a_database() {
    for ok in [
        "sqlite://data/ai.db",
        "sqlite:data/ai.db",
        "sqlite:///var/lib/aio/ai.db?mode=rwc",
        "postgres://aio@db:5432/aio",
        "postgresql://aio:secret@db/aio?sslmode=require",
    ] {
        assert_eq!(database_url(ok), Ok(()), "{ok}");
    }
    for bad in [
        "sqlite://",
        "sqlite:",
        "sqlite://?mode=rwc",
        "sqlite::memory:",
        "sqlite://file:x?mode=memory",
        "postgres://db:5432",
        "postgres://db:5432/",
        "postgres:///aio",
        "mysql://db/aio",
        "",
    ] {
        assert!(database_url(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn a_cluster_section_is_checked_and_its_url_never_printed() {
    let config = |cluster: &str| {
        let toml = format!("[providers.p]\nkind = \"mock\"\n[cluster]\n{cluster}");
        crate::config::Config::from_toml_str(&toml, |_| None)
    };
    assert!(config("redis_url = \"redis://:pw@127.0.0.1:6379/0\"").is_ok());
    let err = config(
        "redis_url = \"http://:hunter2@db:6379\"\nfallback_share = 0\n\
         command_timeout = \"0s\"\non_unavailable = \"refuse\"",
    )
    .err()
    .unwrap();
    assert_eq!(
        err.paths(),
        [
            "cluster.redis_url",
            "cluster.fallback_share",
            "cluster.command_timeout"
        ]
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let parsed = config("redis_url = \"redis://:hunter2@db/0\"").unwrap();
    assert!(!format!("{parsed:?}").contains("hunter2"));
}

#[test]
fn absurd_prices_and_output_caps_are_refused() {
    let config = |extra: &str| {
        let toml = format!(
            "[providers.p]\nkind = \"mock\"\n[tasks.t]\nchain = [{{ provider = \"p\", model = \"m\" }}]\n{extra}"
        );
        crate::config::Config::from_toml_str(&toml, |_| None)
    };
    let paths = |extra: &str| config(extra).err().map(|e| e.paths()).unwrap_or_default();
    assert!(config("[pricing.m]\ninput_per_mtok = 10000\noutput_per_mtok = 0").is_ok());
    assert_eq!(
        paths("[pricing.m]\ninput_per_mtok = 10000.01\noutput_per_mtok = 1e300"),
        [
            "pricing.\"m\".input_per_mtok",
            "pricing.\"m\".output_per_mtok"
        ]
    );
    assert_eq!(
        paths(
            "[pricing.m]\nprice = \"unknown\"\n[tasks.u]\nchain = [{ provider = \"p\", model = \"m\" }]\nmax_tokens = 1000001"
        ),
        ["tasks.u.max_tokens"]
    );
}
