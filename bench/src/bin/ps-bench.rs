//! `ps-bench`: a load generator for parameter servers. See `bench::load`.

use std::process::ExitCode;

use anyhow::Context;
use bench::load::{self, LoadArgs};
use clap::Parser;

fn main() -> ExitCode {
    match run(&LoadArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ps-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let cfg = args.validate()?;
    let report = load::run(&cfg)?;
    print!("{}", report.text());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("serialize the report")?;
        std::fs::write(path, json + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
