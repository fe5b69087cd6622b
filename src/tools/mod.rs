//! Programs that ship beside the gateway: a stand-in v2 backend and a load generator.

pub mod load;
pub mod mock_backend;
