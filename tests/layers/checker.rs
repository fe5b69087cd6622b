//! Reads the package's source as Rust (with `syn`), not as text. The module tree is followed
//! from `src/lib.rs` and `src/main.rs` (`mod` items, inline or in files), and every path each
//! file names is resolved from the scope it is written in to the file that defines what it
//! names: `use` trees however grouped or nested, paths in types, expressions, patterns and
//! macro arguments; `crate::`, `self::`, any number of `super::`, `agent_gateway::` from the
//! binary, child modules, imported names and glob imports; and through re-exports, to the
//! file that defines the item. The layer rule and the cycle check are judged on those edges.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// The library's name, as the binary names it.
const LIB_NAME: &str = "agent_gateway";

/// How deep resolution may follow imports and re-exports (a circle of re-exports ends there).
const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Krate {
    Lib,
    Bin,
}

/// A module: its crate and its path from the crate root.
type ModId = (Krate, Vec<String>);

/// What a module declares, as far as naming goes.
#[derive(Default)]
struct Module {
    /// The file it is written in (an inline module's is its parent's).
    file: String,
    /// Its node in the import graph: its file, or for a `#[cfg(test)]` module written inside
    /// a file, that module (tests use the module; the module does not use its tests).
    node: String,
    children: BTreeSet<String>,
    items: BTreeSet<String>,
    /// Names `use` brings in, with the path they stand for, as written.
    imports: BTreeMap<String, Vec<String>>,
    /// The paths of `use ...::*`, as written.
    globs: Vec<Vec<String>>,
}

/// One path a file names, as written, and the module it is written in.
struct Reference {
    scope: ModId,
    path: Vec<String>,
    /// Named by a `pub use`: a re-export, which makes no edge to the module's own descendants
    /// (users of the name are led through it to the file that defines the item).
    reexport: bool,
}

/// The parsed package: its modules and, per file, every path the file names.
struct Tree {
    modules: BTreeMap<ModId, Module>,
    references: BTreeMap<String, Vec<Reference>>,
    problems: Vec<String>,
}

/// What the check found: each a sentence.
#[derive(Debug, Default)]
pub struct Findings {
    /// Files outside the module tree, or modules outside the layers.
    pub unchecked: Vec<String>,
    /// Uses of a layer listed after the user's.
    pub upward: Vec<String>,
    /// Files that import each other in a circle, one circle each.
    pub cycles: Vec<String>,
}

impl Findings {
    pub fn is_empty(&self) -> bool {
        self.unchecked.is_empty() && self.upward.is_empty() && self.cycles.is_empty()
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self
            .unchecked
            .iter()
            .chain(&self.upward)
            .chain(&self.cycles)
        {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Checks the package whose files are `sources` (path from the package root, such as
/// `src/api/mod.rs`, and text): the library's top-level modules are the layers `layers`, in
/// order; the binary's `cli` module comes after them and its root (`src/main.rs`) last. A file
/// may name only what its own layer or an earlier one defines, and no files may name each
/// other in a circle. Every `.rs` file under `src/` must be in a module tree.
pub fn check(sources: &BTreeMap<String, String>, layers: &[&str]) -> Findings {
    let tree = Tree::parse(sources);
    let mut findings = Findings {
        unchecked: tree.problems.clone(),
        ..Findings::default()
    };
    let files: BTreeSet<&String> = tree.modules.values().map(|m| &m.file).collect();
    for path in sources
        .keys()
        .filter(|p| p.starts_with("src/") && p.ends_with(".rs"))
    {
        if !files.contains(path) {
            findings
                .unchecked
                .push(format!("{path} is in no module tree, so nothing checks it"));
        }
    }
    let rank = |(krate, path): &ModId| -> Result<Option<usize>, String> {
        match (krate, path.first()) {
            (Krate::Lib, None) => Ok(None),
            (Krate::Lib, Some(top)) => layers
                .iter()
                .position(|l| l == top)
                .map(Some)
                .ok_or_else(|| format!("`{top}` is not a layer of the Layout")),
            (Krate::Bin, None) => Ok(Some(layers.len() + 1)),
            (Krate::Bin, Some(top)) if top == "cli" => Ok(Some(layers.len())),
            (Krate::Bin, Some(top)) => Err(format!("the binary's `{top}` is not a layer")),
        }
    };
    let layer_name = |r: usize| match r {
        r if r < layers.len() => layers[r].to_owned(),
        r if r == layers.len() => "cli".to_owned(),
        _ => "main".to_owned(),
    };
    let mut unlayered = BTreeSet::new();
    let mut graph: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for (file, references) in &tree.references {
        for r in references {
            let from = &tree.modules[&r.scope].node;
            graph.entry(from).or_default();
            let Some(target) = tree.target(r) else {
                continue;
            };
            let to = &tree.modules[&target];
            if to.node == *from {
                continue;
            }
            let target_file = &to.file;
            let written = r.path.join("::");
            match (rank(&r.scope), rank(&target)) {
                (Ok(Some(from)), Ok(Some(to))) if to > from => findings.upward.push(format!(
                    "{file} uses `{written}` ({target_file}, layer {}), a layer listed after {}",
                    layer_name(to),
                    layer_name(from)
                )),
                (Err(e), _) | (_, Err(e)) if unlayered.insert(e.clone()) => {
                    findings.unchecked.push(format!("{file}: {e}"));
                }
                _ => {}
            }
            let descendant = target.0 == r.scope.0 && target.1.starts_with(&r.scope.1);
            if !(r.reexport && descendant) {
                graph
                    .entry(from)
                    .or_default()
                    .entry(to.node.clone())
                    .or_insert(written);
            }
        }
    }
    findings.cycles = cycles(&graph);
    findings
}

impl Tree {
    fn parse(sources: &BTreeMap<String, String>) -> Tree {
        let mut tree = Tree {
            modules: BTreeMap::new(),
            references: BTreeMap::new(),
            problems: Vec::new(),
        };
        for (krate, root) in [(Krate::Lib, "src/lib.rs"), (Krate::Bin, "src/main.rs")] {
            if sources.contains_key(root) {
                tree.add_file(sources, root, (krate, Vec::new()));
            }
        }
        tree
    }

    /// Adds the file at `path`, holding the module `id`, and the files of its child modules.
    fn add_file(&mut self, sources: &BTreeMap<String, String>, path: &str, id: ModId) {
        let ast = match syn::parse_file(&sources[path]) {
            Ok(ast) => ast,
            Err(e) => {
                self.problems
                    .push(format!("{path} does not parse, so nothing checks it: {e}"));
                return;
            }
        };
        let mut files = Vec::new();
        self.add_module(path, path, id.clone(), &ast.items, &mut files);
        let mut refs = References {
            scope: id,
            reexport: false,
            out: Vec::new(),
        };
        refs.visit_file(&ast);
        self.references
            .entry(path.to_owned())
            .or_default()
            .extend(refs.out);
        for (child_id, candidates) in files {
            match candidates.iter().find(|c| sources.contains_key(*c)) {
                Some(child) => self.add_file(sources, child, child_id),
                None => self
                    .problems
                    .push(format!("{path}: no file for module {}", candidates[0])),
            }
        }
    }

    /// Notes what the module `id` (written in `file`, a part of `node`) declares; its child
    /// modules in files of their own go to `files`, each with the paths it may be at.
    fn add_module(
        &mut self,
        file: &str,
        node: &str,
        id: ModId,
        items: &[syn::Item],
        files: &mut Vec<(ModId, [String; 2])>,
    ) {
        let mut module = Module {
            file: file.to_owned(),
            node: node.to_owned(),
            ..Module::default()
        };
        for item in items {
            if let Some(name) = item_name(item) {
                module.items.insert(name);
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    module.children.insert(name.clone());
                    let mut child = id.1.clone();
                    child.push(name);
                    let child_id = (id.0, child);
                    if m.attrs.iter().any(|a| a.path().is_ident("path")) {
                        self.problems.push(format!(
                            "{file}: module {} has a #[path]: not followed",
                            m.ident
                        ));
                    }
                    match &m.content {
                        Some((_, items)) => {
                            let node = if is_cfg_test(&m.attrs) {
                                format!("{file} (mod {})", child_id.1.join("::"))
                            } else {
                                node.to_owned()
                            };
                            self.add_module(file, &node, child_id, items, files)
                        }
                        None => {
                            let dir = format!("src/{}", child_id.1.join("/"));
                            files.push((child_id, [format!("{dir}.rs"), format!("{dir}/mod.rs")]));
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let prefix = if u.leading_colon.is_some() {
                        vec!["::".to_owned()]
                    } else {
                        Vec::new()
                    };
                    for (name, path) in use_leaves(&u.tree, prefix) {
                        match name {
                            Some(name) => {
                                module.imports.insert(name, path);
                            }
                            None => module.globs.push(path),
                        }
                    }
                }
                syn::Item::Macro(m) if m.ident.is_none() => {
                    // A declarative macro that defines items (`listed_enum! { pub enum X .. }`).
                    module.items.extend(defined_in_tokens(&m.mac.tokens));
                }
                _ => {}
            }
        }
        self.modules.insert(id, module);
    }

    /// The module that `r` names something of; `None` for what is not the package's (std,
    /// other crates) or is local (`Self`, a generic, a variable).
    fn target(&self, r: &Reference) -> Option<ModId> {
        let absolute = if r.path.len() == 1 {
            self.lookup_in_globs(&r.scope, &r.path[0], 0)?
        } else {
            self.resolve(&r.scope, &r.path, 0)?
        };
        self.locate(absolute, 0)
    }

    /// `path`, written in `scope`, as a path from its crate's root.
    fn resolve(
        &self,
        scope: &ModId,
        path: &[String],
        depth: usize,
    ) -> Option<(Krate, Vec<String>)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let (first, rest) = path.split_first()?;
        let joined = |base: &[String], rest: &[String]| [base, rest].concat();
        match first.as_str() {
            "::" | "Self" => None,
            "crate" => Some((scope.0, rest.to_vec())),
            LIB_NAME => Some((Krate::Lib, rest.to_vec())),
            "self" | "super" => {
                let mut base = scope.1.clone();
                let mut rest = if first == "self" { rest } else { path };
                while let Some(("super", after)) = rest.split_first().map(|(s, a)| (s.as_str(), a))
                {
                    base.pop()?;
                    rest = after;
                }
                Some((scope.0, joined(&base, rest)))
            }
            name => {
                let (krate, base) = self.lookup(scope, name, depth)?;
                Some((krate, joined(&base, rest)))
            }
        }
    }

    /// What the name `name` stands for in `scope`: a child module or an item of it, a name it
    /// imports, or one a glob import brings in.
    fn lookup(&self, scope: &ModId, name: &str, depth: usize) -> Option<(Krate, Vec<String>)> {
        let module = self.modules.get(scope)?;
        if module.children.contains(name) || module.items.contains(name) {
            return Some((scope.0, [scope.1.as_slice(), &[name.to_owned()]].concat()));
        }
        if let Some(path) = module.imports.get(name) {
            return self.resolve(scope, path, depth + 1);
        }
        self.lookup_in_globs(scope, name, depth)
    }

    fn lookup_in_globs(
        &self,
        scope: &ModId,
        name: &str,
        depth: usize,
    ) -> Option<(Krate, Vec<String>)> {
        self.modules.get(scope)?.globs.iter().find_map(|glob| {
            let source = self.resolve(scope, glob, depth + 1)?;
            self.lookup(&source, name, depth + 1)
        })
    }

    /// The module that defines what `absolute` names, following re-exports.
    fn locate(&self, (krate, path): (Krate, Vec<String>), depth: usize) -> Option<ModId> {
        let mut id = (krate, Vec::new());
        let mut rest = path.as_slice();
        while let Some((next, after)) = rest.split_first() {
            if !self.modules.get(&id)?.children.contains(next) {
                break;
            }
            id.1.push(next.clone());
            rest = after;
        }
        let module = self.modules.get(&id)?;
        if let Some((next, after)) = rest.split_first() {
            if !module.items.contains(next) && depth < MAX_DEPTH {
                let reexported = match module.imports.get(next) {
                    Some(path) => self.resolve(&id, path, depth + 1),
                    None => self.lookup_in_globs(&id, next, depth + 1),
                };
                if let Some((k, p)) = reexported {
                    if let Some(found) = self.locate((k, [p.as_slice(), after].concat()), depth + 1)
                    {
                        return Some(found);
                    }
                }
            }
        }
        Some(id)
    }
}

/// Whether an item is `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        matches!(&a.meta, syn::Meta::List(l) if l.path.is_ident("cfg") && l.tokens.to_string() == "test")
    })
}

/// The name an item defines in its module's namespace, if any.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::ExternCrate(i) => i.rename.as_ref().map_or(&i.ident, |(_, r)| r),
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The names `enum X`, `struct X`, `fn x`, ... in a macro's tokens define.
fn defined_in_tokens(tokens: &TokenStream) -> Vec<String> {
    let tokens: Vec<TokenTree> = tokens.clone().into_iter().collect();
    tokens
        .windows(2)
        .filter_map(|w| match w {
            [TokenTree::Ident(kw), TokenTree::Ident(name)]
                if ["enum", "struct", "fn", "const", "static", "type", "trait"]
                    .contains(&kw.to_string().as_str()) =>
            {
                Some(name.to_string())
            }
            _ => None,
        })
        .collect()
}

/// Every leaf of a `use` tree: the name it brings in (`None` for a glob) and its whole path.
fn use_leaves(tree: &syn::UseTree, prefix: Vec<String>) -> Vec<(Option<String>, Vec<String>)> {
    let with = |ident: &syn::Ident| {
        let mut path = prefix.clone();
        path.push(ident.to_string());
        path
    };
    match tree {
        syn::UseTree::Path(p) => use_leaves(&p.tree, with(&p.ident)),
        syn::UseTree::Name(n) if n.ident == "self" => {
            vec![(prefix.last().cloned(), prefix.clone())]
        }
        syn::UseTree::Name(n) => vec![(Some(n.ident.to_string()), with(&n.ident))],
        syn::UseTree::Rename(r) if r.ident == "self" => {
            vec![(Some(r.rename.to_string()), prefix.clone())]
        }
        syn::UseTree::Rename(r) => vec![(Some(r.rename.to_string()), with(&r.ident))],
        syn::UseTree::Glob(_) => vec![(None, prefix)],
        syn::UseTree::Group(g) => g
            .items
            .iter()
            .flat_map(|t| use_leaves(t, prefix.clone()))
            .collect(),
    }
}

/// Collects every path a file names, with the module it is written in.
struct References {
    scope: ModId,
    /// Inside a `pub use`.
    reexport: bool,
    out: Vec<Reference>,
}

impl References {
    fn push(&mut self, path: Vec<String>) {
        self.out.push(Reference {
            scope: self.scope.clone(),
            path,
            reexport: self.reexport,
        });
    }

    /// Paths inside a macro's arguments, which `syn` leaves as tokens: each run of
    /// `name::name...`, a leading `::` kept as such and `$crate` read as `crate`.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let sep_at = |k: usize| k + 1 < tokens.len() && is_path_sep(&tokens[k..k + 2]);
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let after_dollar = i > 0
                        && matches!(&tokens[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let mut path = Vec::new();
                    if i >= 2 && sep_at(i - 2) {
                        path.push("::".to_owned());
                    }
                    path.push(first.to_string());
                    let mut j = i + 1;
                    while sep_at(j) {
                        let Some(TokenTree::Ident(next)) = tokens.get(j + 2) else {
                            break;
                        };
                        path.push(next.to_string());
                        j += 3;
                    }
                    // `$name::...` is a macro variable's path, unknown here; `$crate` is the
                    // crate the macro is defined in.
                    if path.len() > 1 && (!after_dollar || first == "crate") {
                        self.push(path);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

/// Whether `tokens` are `::`.
fn is_path_sep(tokens: &[TokenTree]) -> bool {
    matches!(tokens, [TokenTree::Punct(a), TokenTree::Punct(b)]
        if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
}

impl<'ast> Visit<'ast> for References {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.scope.1.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.scope.1.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let prefix = if u.leading_colon.is_some() {
            vec!["::".to_owned()]
        } else {
            Vec::new()
        };
        self.reexport = !matches!(u.vis, syn::Visibility::Inherited);
        for (_, path) in use_leaves(&u.tree, prefix) {
            self.push(path);
        }
        self.reexport = false;
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let mut path: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if p.leading_colon.is_some() {
            path.insert(0, "::".to_owned());
        }
        self.push(path);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.scan_tokens(m.tokens.clone());
    }
}

/// One line per group of files that reach each other (a strongly connected component): the
/// shortest circle through its first file, step by step with the path that makes each step
/// (`a.rs -> b.rs (`the path`), b.rs -> a.rs (`the path`)`), then the group when it is larger.
fn cycles(graph: &BTreeMap<&str, BTreeMap<String, String>>) -> Vec<String> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([from.to_owned()]);
        while let Some(f) = queue.pop_front() {
            for next in graph.get(f.as_str()).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(next.clone()) {
                    queue.push_back(next.clone());
                }
            }
        }
        seen
    };
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for &file in graph.keys() {
        if done.contains(file) {
            continue;
        }
        let forward = reach(file);
        if !forward.contains(file) {
            continue;
        }
        let component: BTreeSet<String> = forward
            .into_iter()
            .filter(|other| reach(other).contains(file))
            .collect();
        done.extend(component.iter().cloned());
        let (circle, len) = shortest_circle(graph, file, &component);
        out.push(if len < component.len() {
            let all: Vec<&str> = component.iter().map(String::as_str).collect();
            format!(
                "{circle}; in all, these reach each other: {}",
                all.join(", ")
            )
        } else {
            circle
        });
    }
    out
}

/// The shortest way from `start` back to itself inside `component`, each step with the path
/// that makes it.
fn shortest_circle(
    graph: &BTreeMap<&str, BTreeMap<String, String>>,
    start: &str,
    component: &BTreeSet<String>,
) -> (String, usize) {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.to_owned()]);
    'search: while let Some(f) = queue.pop_front() {
        for next in graph.get(f.as_str()).into_iter().flat_map(|e| e.keys()) {
            if !component.contains(next) || came_from.contains_key(next) {
                continue;
            }
            came_from.insert(next.clone(), f.clone());
            if next == start {
                break 'search;
            }
            queue.push_back(next.clone());
        }
    }
    let mut steps = vec![start.to_owned()];
    let mut at = start.to_owned();
    loop {
        let prev = came_from[&at].clone();
        let via = &graph[prev.as_str()][&at];
        steps.push(format!("{prev} -> {at} (`{via}`)"));
        if prev == start {
            break;
        }
        at = prev;
    }
    steps.reverse();
    steps.pop();
    (format!("import circle: {}", steps.join(", ")), steps.len())
}
