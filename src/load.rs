//! `agent-gateway load`: a load generator that speaks the Agent API (to be written).

/// Command-line arguments of `agent-gateway load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {}

/// Why a load run failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not implemented yet")]
    NotImplemented,
}

/// Runs a load test and prints its report.
pub fn run(_args: LoadArgs) -> Result<(), LoadError> {
    Err(LoadError::NotImplemented)
}
