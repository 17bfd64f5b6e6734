//! `serve-bench`: a load generator for `ps-serve`, and its AUC check. See `bench::serve_load`.

use std::process::ExitCode;

use anyhow::Context;
use bench::serve_load::{self, Report, ServeArgs};
use clap::Parser;

fn main() -> ExitCode {
    match run(&ServeArgs::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let cfg = args.validate()?;
    let report = serve_load::run(&cfg)?;
    println!("{}", report.line());
    if let Report::Load(r) = &report {
        for (kind, msg) in &r.errors_by_status.first {
            eprintln!("serve-bench: first {kind} failure: {msg}");
        }
    }
    if let Report::Auc(r) = &report {
        if r.min_version != r.version {
            eprintln!(
                "serve-bench: the model changed during the pass (versions {}..{})",
                r.min_version, r.version
            );
        }
    }
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("serialize the report")?;
        std::fs::write(path, json + "\n").with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
