//! The layer rule of `src/lib.rs` (its Layout lists the layers in order; each uses only the
//! ones above it; the binary's `cli/` and `main.rs` come after them all) and no import
//! circle between files anywhere, checked on every file of `src/` read as Rust by
//! [`checker`]. Below, the checker's own tests on made-up sources, so that it cannot pass by
//! missing what it must see.

mod checker;

use std::collections::BTreeMap;
use std::path::Path;

/// The folders in the order the Layout of `src/lib.rs` lists them: the crate's layers.
fn layers(lib_rs: &str) -> Vec<&str> {
    lib_rs
        .lines()
        .filter_map(|l| l.strip_prefix("//! - [`"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name))
        .collect()
}

/// Every file under `dir`, by its path from the package root.
fn read_tree(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            read_tree(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn each_layer_uses_only_the_ones_listed_above_it_and_no_files_import_each_other_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = BTreeMap::new();
    read_tree(root, &root.join("src"), &mut sources);
    let layers = layers(&sources["src/lib.rs"]);
    assert!(layers.len() >= 8, "the Layout lists {layers:?}");
    let findings = checker::check(&sources, &layers);
    assert!(findings.is_empty(), "\n{findings}");
}

/// The checker on made-up packages.
mod the_checker {
    use super::*;

    const LAYERS: [&str; 3] = ["low", "mid", "high"];

    /// A package of `files` (path, text) whose lib.rs declares the three layers.
    fn check(files: &[(&str, &str)]) -> checker::Findings {
        let mut sources: BTreeMap<String, String> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        sources
            .entry("src/lib.rs".into())
            .or_insert_with(|| "pub mod low; pub mod mid; pub mod high;".into());
        for layer in LAYERS {
            sources
                .entry(format!("src/{layer}/mod.rs"))
                .or_insert_with(|| "pub struct Thing;".into());
        }
        checker::check(&sources, &LAYERS)
    }

    fn upward(files: &[(&str, &str)]) -> Vec<String> {
        check(files).upward
    }

    #[test]
    fn a_plain_downward_use_passes() {
        let f = check(&[(
            "src/high/mod.rs",
            "use crate::low::Thing; use super::mid::Thing as T;",
        )]);
        assert!(f.is_empty(), "{f}");
    }

    #[test]
    fn an_upward_use_is_refused_however_it_is_written() {
        for (how, text) in [
            ("a plain use", "use crate::high::Thing;"),
            ("a group", "use crate::{low::Thing, high::Thing as H};"),
            (
                "a nested group over lines",
                "use crate::{\n    low,\n    high::{\n        Thing,\n    },\n};",
            ),
            (
                "super::super",
                "pub mod inner { use super::super::high::Thing; }",
            ),
            ("self then super", "use self::super::high::Thing;"),
            ("a glob", "use crate::high::*;"),
            ("the module itself", "use crate::high;"),
            (
                "a path in an expression",
                "fn f() { let _ = crate::high::Thing; }",
            ),
            ("a path in a type", "fn f(_: Option<crate::high::Thing>) {}"),
            (
                "a path in a pattern",
                "fn f(t: ()) { let crate::high::Thing = todo!(); }",
            ),
            (
                "a path in a macro's arguments",
                "fn f() { assert!(matches!(x, crate::high::Thing)); }",
            ),
            (
                "an imported module's path",
                "use crate::high as h; fn f() { let _ = h::Thing; }",
            ),
            (
                "a string that hides nothing",
                "const URL: &str = \"http://x\"; use crate::high::Thing;",
            ),
        ] {
            let found = upward(&[("src/mid/mod.rs", text)]);
            assert!(!found.is_empty(), "{how}: not found");
            for f in &found {
                assert!(f.starts_with("src/mid/mod.rs uses"), "{how}: {f}");
                assert!(
                    f.contains("layer high), a layer listed after mid"),
                    "{how}: {f}"
                );
            }
        }
    }

    #[test]
    fn comments_strings_and_other_crates_are_not_uses() {
        let f = check(&[(
            "src/mid/mod.rs",
            "// use crate::high::Thing;\n/// [`crate::high`]\nconst S: &str = \"crate::high::Thing\";\nuse std::collections::HashMap;",
        )]);
        assert!(f.is_empty(), "{f}");
    }

    #[test]
    fn the_binary_is_checked_too() {
        let found = upward(&[
            ("src/main.rs", "mod cli; use agent_gateway::low::Thing;"),
            ("src/cli/mod.rs", "pub mod run;"),
            (
                "src/cli/run.rs",
                "use crate::Command; use agent_gateway::high::Thing;",
            ),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("src/cli/run.rs uses `crate::Command`"),
            "{found:?}"
        );
        assert!(found[0].contains("layer main"), "{found:?}");
    }

    #[test]
    fn a_file_outside_the_tree_or_a_module_outside_the_layers_is_reported() {
        let f = check(&[("src/stray.rs", "use crate::high::Thing;")]);
        assert_eq!(f.unchecked.len(), 1, "{f}");
        assert!(f.unchecked[0].starts_with("src/stray.rs is in no module tree"));
        let f = check(&[
            (
                "src/lib.rs",
                "pub mod low; pub mod mid; pub mod high; pub mod extra;",
            ),
            ("src/extra.rs", "use crate::low::Thing;"),
        ]);
        assert!(
            f.unchecked
                .iter()
                .any(|u| u.contains("`extra` is not a layer")),
            "{f}"
        );
    }

    #[test]
    fn a_circle_between_files_is_reported_with_its_steps() {
        let f = check(&[
            ("src/mid/mod.rs", "pub mod a; pub mod b; pub mod c;"),
            ("src/mid/a.rs", "use super::b::B; pub struct A;"),
            (
                "src/mid/b.rs",
                "pub struct B; pub fn f() -> super::c::C { todo!() }",
            ),
            (
                "src/mid/c.rs",
                "pub struct C; fn g() { let _ = crate::mid::a::A; }",
            ),
        ]);
        assert!(f.upward.is_empty(), "{f}");
        assert_eq!(
            f.cycles,
            [
                "import circle: src/mid/a.rs -> src/mid/b.rs (`super::b::B`), \
              src/mid/b.rs -> src/mid/c.rs (`super::c::C`), \
              src/mid/c.rs -> src/mid/a.rs (`crate::mid::a::A`)"
            ]
        );
    }

    #[test]
    fn a_re_export_leads_to_the_file_that_defines_the_item() {
        // `mid` re-exports `a`'s item and `a` uses `mid`'s own: that is no circle, but `b`
        // naming the item through the re-export depends on `a`, which depends on `b`.
        let f = check(&[
            (
                "src/mid/mod.rs",
                "mod a; mod b; pub use a::A; pub struct Shared;",
            ),
            (
                "src/mid/a.rs",
                "use super::Shared; use super::b::B; pub struct A;",
            ),
            ("src/mid/b.rs", "use super::A; pub struct B;"),
        ]);
        assert_eq!(
            f.cycles,
            [
                "import circle: src/mid/a.rs -> src/mid/b.rs (`super::b::B`), \
              src/mid/b.rs -> src/mid/a.rs (`super::A`)"
            ],
            "{f}"
        );
    }
}
