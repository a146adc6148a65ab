pub async fn run(_url: &str, _args: &crate::cli::BenchArgs) -> anyhow::Result<()> { anyhow::bail!("todo") }
