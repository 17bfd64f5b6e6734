//! `freshness-probe`: push-acknowledged to served latency of delta sync. See `bench::freshness`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = bench::freshness::ProbeArgs::parse();
    let rt = tokio::runtime::Runtime::new()?;
    println!("{}", rt.block_on(bench::freshness::run(&args))?);
    Ok(())
}
