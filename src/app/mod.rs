//! Process assembly: the pingora server and its services, live config, signals, the admin
//! listener (and its retirement board's page) and the log subscriber.

pub mod admin;
pub mod board;
pub mod head_deadline;
pub mod listeners;
pub mod logging;
pub mod proxy_protocol;
pub mod reload;
pub mod serve;
pub mod served_cert;
pub mod server;
pub mod signals;
