//! Process assembly: the pingora server and its services, live config, signals, the admin
//! listener and the log subscriber.

pub mod admin;
pub mod listeners;
pub mod logging;
pub mod proxy_protocol;
pub mod reload;
pub mod serve;
pub mod server;
pub mod signals;
