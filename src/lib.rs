//! agent-gateway: a pingora reverse proxy that serves v1 and v2 of the Agent REST Service in
//! front of a backend that speaks only v2.
//!
//! # Layout
//! Each folder is one layer; a layer uses only the ones listed above it.
//! - [`http1`]: the HTTP/1.1 codec over bytes: heads, framing, chunked bodies, writers. Pure,
//!   and a leaf: it uses nothing else in the crate.
//! - [`config`]: the TOML file as written, and the validated [`config::Snapshot`] the gateway runs on.
//! - [`api`]: the Agent API surface: the operation table, routes, body schemas, OpenAPI, the gateway's own answers.
//! - [`policy`]: per-request decisions as plain functions: admission, auth, retirement, rate limits (local, or shared in Redis), request ids.
//! - [`observe`]: what happened to each request: the record, metrics, the access log, v1 usage.
//! - [`proxy`]: the data plane: client connections, the request pipeline, backends, the pool, health checks.
//! - [`tools`]: programs beside the gateway: the mock v2 backend and the load generator.
//! - [`app`]: process assembly: the pingora server, live config reload, signals, the admin listener, logging.
//!
//! The command line (`src/main.rs`, `src/cli/`) is the binary's own; errors become `anyhow` there.
#![forbid(unsafe_code)]

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
pub mod config;
pub mod http1;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod tools;

#[cfg(test)]
mod layers {
    use std::path::Path;

    /// The folders in the order the Layout above lists them: the order of the crate's layers.
    fn layers() -> Vec<String> {
        include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! - [`"))
            .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_owned()))
            .collect()
    }

    /// Every `crate::<folder>` a file's code (not its comments) names.
    fn uses(path: &Path, out: &mut Vec<(String, String)>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                uses(&entry.unwrap().path(), out);
            }
            return;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            return;
        }
        for line in std::fs::read_to_string(path).unwrap().lines() {
            let code = line.split("//").next().unwrap_or_default();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                out.push((path.display().to_string(), rest[..end].to_owned()));
            }
        }
    }

    #[test]
    fn each_layer_uses_only_the_ones_listed_above_it() {
        let layers = layers();
        assert!(layers.len() >= 8, "the Layout lists {layers:?}");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for (rank, layer) in layers.iter().enumerate() {
            let mut found = Vec::new();
            uses(&src.join(layer), &mut found);
            for (file, used) in found {
                let above = layers[..=rank].contains(&used);
                assert!(
                    above || !layers.contains(&used),
                    "{file} uses crate::{used}, a layer below {layer}"
                );
            }
        }
    }
}
