//! agent-gateway: a pingora reverse proxy that serves v1 and v2 of the Agent REST Service in
//! front of a backend that speaks only v2.
//!
//! # Layout
//! Each folder is one layer; a layer uses only the ones listed above it.
//! - [`http1`]: the HTTP/1.1 codec over bytes: heads, framing, chunked bodies, writers. Pure,
//!   and a leaf: it uses nothing else in the crate.
//! - [`client`]: an HTTP(S) client for the APIs the gateway and its commands read (a Prometheus, an admin listener): TLS roots or a CA file, a bearer token or basic auth; the TLS settings of every client of ours (`client::tls`); and how a secret, a URL's password among them, is redacted wherever it is shown (`client::redact`).
//! - [`config`]: the TOML file as written, and the validated [`config::Snapshot`] the gateway runs on.
//! - [`api`]: the Agent API surface: the operation table, routes, body schemas, OpenAPI, the gateway's own answers.
//! - [`policy`]: per-request decisions as plain functions: admission, auth, retirement, rate limits (local, or shared in Redis), request ids.
//! - [`observe`]: what happened to each request: the record, metrics, the access log, v1 usage.
//! - [`proxy`]: the data plane: client connections, the request pipeline, backends, the pool, health checks.
//! - [`tools`]: programs beside the gateway: the mock v2 backend and the load generator.
//! - [`app`]: process assembly: the pingora server, live config reload, signals, the admin listener, logging.
//!
//! The command line is the binary's own, on top: `src/cli/` (one file per command) above
//! `app`, and `src/main.rs` (parsing and dispatch) above `cli`; errors become `anyhow` there.
//!
//! `tests/layers` holds the package to this order: it reads every file of `src/` as Rust (with
//! `syn`), resolves each path a file names (in `use` trees however grouped, in types,
//! expressions, patterns and macro arguments; through `crate::`, `super::`, imports and
//! re-exports) to the file that defines it, and refuses a use of a later layer and any circle
//! of files that import each other, naming its steps. Checked that way rather than by making
//! each layer a crate of the workspace: a crate boundary refuses an upward import but not a
//! circle between the files of one layer, which is where circles form (the load tool had one),
//! and the layers stay modules of one crate, with no churn of manifests and re-exports.
#![deny(unsafe_code)]

/// A fieldless enum whose variants are written once, each with its label: the macro adds
/// `ALL` (every variant in declaration order, so `v as usize` is its index), `COUNT`, and, when
/// the variants are given labels (`Variant => "label"`), `as_str`. Arrays of metric handles
/// are sized and indexed by these, so a new variant has its label and its place everywhere.
macro_rules! listed_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $label:literal, )+
        }
    ) => {
        listed_enum! {
            $(#[$meta])*
            $vis enum $name {
                $( $(#[$vmeta])* $variant, )+
            }
        }

        impl $name {
            /// Its label (metrics, logs, reports).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $label, )+
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident, )+
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        #[allow(dead_code, reason = "the macro's own items, like a derive's: not every enum uses both")]
        impl $name {
            /// Every variant, in declaration order: `v as usize` is its index.
            pub const ALL: [$name; [$( stringify!($variant) ),+].len()] = [$( $name::$variant ),+];
            pub const COUNT: usize = Self::ALL.len();
        }
    };
}

pub mod api;
pub mod app;
pub mod client;
pub mod config;
pub mod http1;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod tools;
