//! A/B runs (`--compare-bin`): the same scenarios against two server
//! binaries in alternated rounds, A B B A A B …, so that the drift of a
//! shared machine falls on both sides alike, then one comparison of every
//! figure the rounds measured (docs/benchmarks.md, "A/B runs"). Each round
//! is a whole run with its own `results.json` and `results.md` under
//! `--out`; the comparison is `ab.md` and `ab.json` beside them.

mod compare;

use crate::cli::Args;
use anyhow::{Context, ensure};
use compare::Side;
use serde::Serialize;
use std::{io::Write, path::PathBuf};

/// The run `args` ask for: an A/B run with `--compare-bin`, else one run.
pub async fn run(mut args: Args) -> anyhow::Result<()> {
    let Some(b_bin) = args.compare_bin.take() else {
        return crate::run::run(args).await.map(drop);
    };
    ensure!(args.pairs >= 1, "--pairs must be at least 1");
    ensure!(
        b_bin.is_file(),
        "--compare-bin {} is not a file",
        b_bin.display()
    );
    // A bare name would be looked up in PATH when the server starts, not
    // where it was just found.
    let b_bin = std::path::absolute(&b_bin)?;
    if let Some(a_bin) = &args.server_bin {
        args.server_bin = Some(std::path::absolute(a_bin)?);
    }
    let order = order(args.pairs);
    let mut ab = AbResults {
        a_bin: args.server_bin.clone(),
        b_bin: b_bin.clone(),
        order: Vec::with_capacity(order.len()),
        rows: Vec::new(),
    };
    let mut rounds = Vec::with_capacity(order.len());
    let mut failed = None;
    for (i, side) in order.iter().copied().enumerate() {
        let round = round_args(&args, &b_bin, i, side);
        tracing::info!(round = i + 1, of = order.len(), side = %side, "A/B round");
        match crate::run::run(round).await {
            Ok(results) => {
                ab.order.push(round_folder(i, side));
                rounds.push((side, results));
            }
            Err(e) => {
                failed = Some(e.context(format!("A/B round {} ({side})", i + 1)));
                break;
            }
        }
    }
    // The rounds done are worth their comparison even when one failed:
    // a long run's last round should not cost the others.
    if !rounds.is_empty() {
        ab.rows = compare::compare(&rounds);
        write(&args, &ab)?;
    }
    failed.map_or(Ok(()), Err)
}

/// Rounds in the order A B B A A B … for `pairs` pairs: with an even
/// number of pairs each side goes first as often as second, so a steady
/// drift of the machine over the run does not favour either.
pub fn order(pairs: usize) -> Vec<Side> {
    (0..pairs)
        .flat_map(|i| {
            if i % 2 == 0 {
                [Side::A, Side::B]
            } else {
                [Side::B, Side::A]
            }
        })
        .collect()
}

/// The arguments of round `i`: the A/B run's own, with B's binary on B's
/// rounds and the round's folder under `--out`.
fn round_args(args: &Args, b_bin: &std::path::Path, i: usize, side: Side) -> Args {
    let folder = round_folder(i, side);
    let mut round = args.clone();
    round.compare_bin = None;
    if side == Side::B {
        round.server_bin = Some(b_bin.to_path_buf());
    }
    round.out = args.out.join(&folder);
    round.ab_round = Some(folder);
    round
}

fn round_folder(i: usize, side: Side) -> String {
    format!("round-{:02}-{side}", i + 1)
}

/// What `ab.json` holds.
#[derive(Debug, Serialize)]
struct AbResults {
    /// `--server-bin` (A); none means the binary next to the bench's.
    a_bin: Option<PathBuf>,
    /// `--compare-bin` (B).
    b_bin: PathBuf,
    /// The folders under `--out` of the rounds compared, in run order.
    order: Vec<String>,
    /// Every figure, with each side's rounds.
    rows: Vec<compare::Row>,
}

fn write(args: &Args, ab: &AbResults) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::write(args.out.join("ab.json"), serde_json::to_string_pretty(ab)?)?;
    let a = ab.a_bin.as_ref().map_or_else(
        || "the `ai-orchestrator` next to the bench".to_owned(),
        |p| format!("`{}`", p.display()),
    );
    let b = format!("`{}`", ab.b_bin.display());
    let markdown = compare::markdown(&a, &b, &ab.order, &ab.rows);
    std::fs::write(args.out.join("ab.md"), &markdown)?;
    let _ = std::io::stdout().lock().write_all(markdown.as_bytes());
    tracing::info!(out = %args.out.display(), "A/B comparison written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Side::{A, B};
    use clap::Parser;

    #[test]
    fn an_even_number_of_pairs_has_each_side_first_as_often_as_second() {
        assert_eq!(order(1), [A, B]);
        assert_eq!(order(2), [A, B, B, A]);
        assert_eq!(order(4), [A, B, B, A, A, B, B, A]);
        let first_in_pair = |o: &[Side], side| o.chunks(2).filter(|p| p[0] == side).count();
        let o = order(6);
        assert_eq!(first_in_pair(&o, A), first_in_pair(&o, B));
        assert_eq!(round_folder(9, B), "round-10-B");
    }

    #[test]
    fn a_round_runs_its_sides_binary_into_its_own_folder() {
        let args = Args::parse_from([
            "bench",
            "--server-bin",
            "/a/ai-orchestrator",
            "--compare-bin",
            "/b/ai-orchestrator",
            "--out",
            "/tmp/ab",
            "--rates",
            "1200",
        ]);
        let b = std::path::Path::new("/b/ai-orchestrator");
        let first = round_args(&args, b, 0, A);
        assert_eq!(
            first.server_bin.as_deref(),
            Some(std::path::Path::new("/a/ai-orchestrator"))
        );
        assert_eq!(first.out, std::path::Path::new("/tmp/ab/round-01-A"));
        assert_eq!(first.ab_round.as_deref(), Some("round-01-A"));
        assert_eq!(first.compare_bin, None, "a round is a plain run");
        assert_eq!(
            first.rates,
            Some(vec![1200.0]),
            "the other flags carry over"
        );
        let second = round_args(&args, b, 1, B);
        assert_eq!(second.server_bin.as_deref(), Some(b));
        assert_eq!(second.out, std::path::Path::new("/tmp/ab/round-02-B"));
    }
}
