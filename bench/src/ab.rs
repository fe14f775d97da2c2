//! A/B runs (`--compare-bin`): the same scenarios against two server
//! binaries in alternated rounds, A B B A A B …, so that the drift of a
//! shared machine falls on both sides alike, then one comparison of every
//! figure the rounds measured (docs/benchmarks.md, "A/B runs"). Each round
//! is a whole run with its own `results.json` and `results.md` under
//! `--out`; the comparison is `ab.md` and `ab.json` beside them.

mod compare;

use crate::{cli::Args, report};
use anyhow::{Context, ensure};
use compare::Side;
use serde::Serialize;
use std::{io::Write, path::PathBuf};

/// The run `args` ask for: an A/B run with `--compare-bin`, else one run.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Some(b_bin) = args.compare_bin.clone() else {
        return crate::run::run(args).await;
    };
    ensure!(args.pairs >= 1, "--pairs must be at least 1");
    ensure!(
        b_bin.is_file(),
        "--compare-bin {} is not a file",
        b_bin.display()
    );
    let order = order(args.pairs);
    let mut rounds = Vec::with_capacity(order.len());
    for (i, side) in order.iter().copied().enumerate() {
        let mut round = args.clone();
        round.compare_bin = None;
        if side == Side::B {
            round.server_bin = Some(b_bin.clone());
        }
        round.out = args.out.join(round_folder(i, side));
        tracing::info!(round = i + 1, of = order.len(), side = %side, "A/B round");
        crate::run::run(round.clone())
            .await
            .with_context(|| format!("A/B round {} ({side})", i + 1))?;
        let path = round.out.join("results.json");
        let json = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        rounds.push((side, report::validate(&json, args.smoke)?));
    }
    let ab = AbResults {
        a_bin: args.server_bin.clone(),
        b_bin,
        order: order
            .iter()
            .enumerate()
            .map(|(i, s)| round_folder(i, *s))
            .collect(),
        rows: compare::compare(&rounds),
    };
    write(&args, &ab)
}

/// Rounds in the order A B B A A B … for `pairs` pairs: each side goes
/// first as often as second, so a steady drift of the machine over the
/// run does not favour either.
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
    /// The rounds' folders under `--out`, in the order they ran.
    order: Vec<String>,
    /// Every figure, with each side's rounds.
    rows: Vec<compare::Row>,
}

fn write(args: &Args, ab: &AbResults) -> anyhow::Result<()> {
    std::fs::write(args.out.join("ab.json"), serde_json::to_string_pretty(ab)?)?;
    let a = ab.a_bin.as_ref().map_or_else(
        || "the `ai-orchestrator` next to the bench".to_owned(),
        |p| format!("`{}`", p.display()),
    );
    let markdown = compare::markdown(
        &a,
        &format!("`{}`", ab.b_bin.display()),
        &ab.order,
        &ab.rows,
    );
    std::fs::write(args.out.join("ab.md"), &markdown)?;
    let _ = std::io::stdout().lock().write_all(markdown.as_bytes());
    tracing::info!(out = %args.out.display(), "A/B comparison written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Side::{A, B};

    #[test]
    fn each_side_goes_first_as_often_as_second() {
        assert_eq!(order(1), [A, B]);
        assert_eq!(order(3), [A, B, B, A, A, B]);
        assert_eq!(order(4), [A, B, B, A, A, B, B, A]);
        assert_eq!(round_folder(9, B), "round-10-B");
    }
}
