//! The tree's rules, checked on the source itself: the module graph (every `crate::` and
//! `super::` path outside unit tests) has no cycle, between files or between the parts
//! the tree names (`core::domain`, `core::usecases`, `doors::http`, `adapters::aws`, ...);
//! nothing under `core` reaches an adapter, a door or the wiring; the domain and the policy
//! never reach the use cases; adapters never reach a door; the cross-cutting modules
//! (`config`, `metrics`, `telemetry`, `failpoint`) reach only `core`.
//!
//! Paths are read, not resolved by the compiler: a `use` tree (`crate::{a::b, c}`) or a
//! path in code names the longest module prefix that is a file. Comments,
//! `#[cfg(test)] mod tests { .. }` and the files of unit-test modules declared out of line
//! (`#[cfg(test)]` then `mod tests;`) are left out (a test may reach anywhere).
//!
//! And no file's production part, the lines before its first `#[cfg(test)]` line at the
//! start of a line, is over [`MAX_PRODUCTION_LINES`]: a longer file holds more than one job.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source tree") {
        let p = entry.expect("a directory entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The files of unit-test modules declared out of line (`#[cfg(test)]`, then `mod x;` on
/// the next line), and every file under such a module: test code.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).expect("a source file");
        // The folder of the modules this file declares.
        let dir = match f.file_stem().and_then(|s| s.to_str()) {
            Some("mod" | "lib" | "main") => f.parent().expect("a folder").to_path_buf(),
            _ => f.with_extension(""),
        };
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.windows(2) {
            if pair[0].trim() != "#[cfg(test)]" {
                continue;
            }
            let decl = pair[1].trim();
            let decl = ["pub(crate) ", "pub(super) ", "pub "]
                .iter()
                .find_map(|p| decl.strip_prefix(p))
                .unwrap_or(decl);
            let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else {
                continue;
            };
            let folder = dir.join(name);
            out.insert(dir.join(format!("{name}.rs")));
            out.extend(files.iter().filter(|g| g.starts_with(&folder)).cloned());
        }
    }
    out
}

/// `core/usecases/mod.rs` -> `[core, usecases]`; `lib.rs` -> `[]`.
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).expect("under src");
    let mut parts: Module = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text that counts: no comments, no unit-test module.
fn code(text: &str) -> String {
    let text = text
        .find("#[cfg(test)]\nmod tests")
        .map_or(text, |i| &text[..i]);
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths of a use tree starting at `s` (after `crate::` or `super::`).
fn use_tree(s: &[u8], mut i: usize) -> (Vec<Module>, usize) {
    let skip_ws = |i: &mut usize| {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    skip_ws(&mut i);
    if i < s.len() && s[i] == b'{' {
        i += 1;
        let mut all = Vec::new();
        loop {
            skip_ws(&mut i);
            if i >= s.len() || s[i] == b'}' {
                return (all, i + 1);
            }
            let (sub, j) = use_tree(s, i);
            all.extend(sub);
            i = j;
            skip_ws(&mut i);
            if i < s.len() && s[i] == b',' {
                i += 1;
            }
        }
    }
    let start = i;
    while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
        i += 1;
    }
    let name = String::from_utf8_lossy(&s[start..i]).into_owned();
    if name.is_empty() {
        return (vec![vec![]], i);
    }
    if s[i..].starts_with(b"::") {
        let (sub, j) = use_tree(s, i + 2);
        let paths = sub
            .into_iter()
            .map(|mut p| {
                p.insert(0, name.clone());
                p
            })
            .collect();
        return (paths, j);
    }
    (vec![vec![name]], i)
}

/// Every module a file's code names, resolved to the longest prefix that is a module.
fn references(module: &Module, text: &str, known: &BTreeSet<Module>) -> BTreeSet<Module> {
    let s = text.as_bytes();
    let mut found = BTreeSet::new();
    for (anchor, relative) in [("crate::", false), ("super::", true)] {
        let mut from = 0;
        while let Some(k) = text[from..].find(anchor) {
            let at = from + k;
            from = at + anchor.len();
            let before = s.get(at.wrapping_sub(1)).copied().unwrap_or(b' ');
            if before.is_ascii_alphanumeric() || before == b'_' || (before == b':' && !relative) {
                continue;
            }
            if relative && before == b':' {
                continue; // `super::super::` is read from its first `super`
            }
            let (paths, _) = use_tree(s, from);
            for path in paths {
                let mut full: Module = if relative {
                    // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` too (the module is `a::b`).
                    let mut base = module.clone();
                    base.pop();
                    base
                } else {
                    Vec::new()
                };
                for seg in path {
                    match seg.as_str() {
                        "self" => {}
                        "super" => {
                            full.pop();
                        }
                        _ => full.push(seg),
                    }
                }
                while !full.is_empty() && !known.contains(&full) {
                    full.pop();
                }
                if &full != module {
                    found.insert(full);
                }
            }
        }
    }
    found
}

/// The part of the tree a module belongs to: `core::x`, `doors::x`, `adapters::x`, or a
/// top-level module.
fn part(m: &Module) -> String {
    match m.as_slice() {
        [] => "crate".into(),
        [layer, child, ..] if matches!(layer.as_str(), "core" | "doors" | "adapters") => {
            format!("{layer}::{child}")
        }
        [top, ..] => top.clone(),
    }
}

fn cycle<N: Ord + Clone + std::fmt::Debug>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    // Depth-first search with colours; returns one cycle if there is one.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        Grey,
        Black,
    }
    fn visit<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        colour: &mut BTreeMap<N, Colour>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        colour.insert(n.clone(), Colour::Grey);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            match colour.get(m) {
                Some(Colour::Grey) => {
                    let i = stack.iter().position(|x| x == m).unwrap_or(0);
                    let mut c = stack[i..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                Some(Colour::Black) => {}
                None => {
                    if let Some(c) = visit(m, graph, colour, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        colour.insert(n.clone(), Colour::Black);
        None
    }
    let mut colour = BTreeMap::new();
    for n in graph.keys() {
        if !colour.contains_key(n) {
            if let Some(c) = visit(n, graph, &mut colour, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Whether an arrow from part `from` to part `to` breaks a layer rule, and which.
fn broken_rule(from: &str, to: &str) -> Option<&'static str> {
    let layer = |p: &str| p.split("::").next().unwrap_or("").to_string();
    let (lf, lt) = (layer(from), layer(to));
    let cross_cutting = |l: &str| matches!(l, "config" | "metrics" | "telemetry" | "failpoint");
    if lf == "core" && matches!(lt.as_str(), "adapters" | "doors" | "app") {
        return Some("the core reaches an adapter, a door or the wiring");
    }
    if matches!(from, "core::domain" | "core::policy") && to == "core::usecases" {
        return Some("the domain or the policy reaches the use cases");
    }
    if lf == "adapters" && matches!(lt.as_str(), "doors" | "app") {
        return Some("an adapter reaches a door or the wiring");
    }
    if cross_cutting(&lf) && !(lt == "core" || cross_cutting(&lt)) {
        return Some("a cross-cutting module reaches past the core");
    }
    None
}

/// Every file's module and the modules its code names.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let tests = test_files(&files);
    files.retain(|f| !tests.contains(f));
    let modules: BTreeMap<Module, PathBuf> = files
        .iter()
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, f)| {
            let text = code(&std::fs::read_to_string(f).expect("a source file"));
            (m.clone(), references(m, &text, &known))
        })
        .collect()
}

/// The first rule the graph breaks, said plainly.
fn verdict(by_file: &BTreeMap<Module, BTreeSet<Module>>) -> Result<(), String> {
    if let Some(c) = cycle(by_file) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        return Err(format!("a cycle of files: {}", names.join(" -> ")));
    }
    let mut by_part: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for (m, refs) in by_file {
        for r in refs {
            let (a, b) = (part(m), part(r));
            if a == b || b == "crate" {
                continue;
            }
            if let Some(rule) = broken_rule(&a, &b) {
                broken.push(format!("{} -> {}: {rule}", m.join("::"), r.join("::")));
            }
            by_part.entry(a).or_default().insert(b);
        }
    }
    if !broken.is_empty() {
        return Err(format!("layer rules broken:\n{}", broken.join("\n")));
    }
    if let Some(c) = cycle(&by_part) {
        return Err(format!(
            "a cycle between parts of the tree: {}",
            c.join(" -> ")
        ));
    }
    Ok(())
}

/// The most lines a file's production part may have.
const MAX_PRODUCTION_LINES: usize = 800;

/// The lines of a file's production part: those before its first `#[cfg(test)]` line (at
/// the start of the line: a test-only item inside an `impl` does not end it).
fn production_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| l.trim_end() != "#[cfg(test)]")
        .count()
}

/// Each production file under `roots` whose production part is over
/// [`MAX_PRODUCTION_LINES`], with its count, and how many files were read.
fn long_files(roots: &[PathBuf]) -> (Vec<(PathBuf, usize)>, usize) {
    let (mut long, mut read) = (Vec::new(), 0);
    for root in roots {
        let mut files = Vec::new();
        sources(root, &mut files);
        let tests = test_files(&files);
        for f in files.iter().filter(|f| !tests.contains(*f)) {
            let n = production_lines(&std::fs::read_to_string(f).expect("a source file"));
            read += 1;
            if n > MAX_PRODUCTION_LINES {
                long.push((f.clone(), n));
            }
        }
    }
    (long, read)
}

#[test]
fn no_production_file_is_over_800_lines() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = shared.parent().expect("the workspace");
    let mut roots = vec![shared.join("src")];
    for entry in std::fs::read_dir(workspace.join("functions")).expect("functions/") {
        let src = entry.expect("a directory entry").path().join("src");
        if src.is_dir() {
            roots.push(src);
        }
    }
    assert!(roots.len() > 10, "only {roots:?}: the walk is broken");
    let (long, read) = long_files(&roots);
    assert!(read > 100, "only {read} files read: the walk is broken");
    let named: Vec<String> = long
        .iter()
        .map(|(f, n)| {
            let f = f.strip_prefix(workspace).unwrap_or(f);
            format!("{}: {n} production lines", f.display())
        })
        .collect();
    assert!(
        named.is_empty(),
        "over {MAX_PRODUCTION_LINES} production lines (before the first `#[cfg(test)]` line); \
         split each into modules of one job:\n{}",
        named.join("\n")
    );
}

#[test]
fn a_long_file_is_named_and_test_modules_do_not_count() {
    let root = std::env::temp_dir().join(format!("airlock-long-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let write = |path: &str, text: &str| {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().expect("a folder")).expect("a folder");
        std::fs::write(p, text).expect("a file");
    };
    let lines = |n: usize| "fn f() {}\n".repeat(n);
    write("lib.rs", "pub mod a;\npub mod b;\n");
    // Production, then an inline test module as long as it likes.
    write(
        "a/mod.rs",
        &format!(
            "{}impl X {{\n    #[cfg(test)]\n    fn t() {{}}\n}}\n#[cfg(test)]\nmod tests;\n{}",
            lines(MAX_PRODUCTION_LINES - 6),
            lines(2000)
        ),
    );
    // An out-of-line test module, and a file under it.
    write("a/tests.rs", &lines(2000));
    write("b.rs", "#[cfg(test)]\nmod tests;\n");
    write("b/tests/mod.rs", "mod more;\n");
    write("b/tests/more.rs", &lines(2000));
    let (long, read) = long_files(std::slice::from_ref(&root));
    assert_eq!((long, read), (vec![], 3));
    // One line more in production.
    write(
        "a/mod.rs",
        &format!(
            "{}impl X {{\n    #[cfg(test)]\n    fn t() {{}}\n}}\n#[cfg(test)]\nmod tests;\n",
            lines(MAX_PRODUCTION_LINES - 3),
        ),
    );
    let (long, _) = long_files(std::slice::from_ref(&root));
    assert_eq!(
        long,
        vec![(root.join("a/mod.rs"), MAX_PRODUCTION_LINES + 1)]
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_module_graph_has_no_cycle_and_keeps_its_layers() {
    let by_file = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let edges: usize = by_file.values().map(BTreeSet::len).sum();
    assert!(
        edges > 200,
        "the reader found only {edges} references: it is broken"
    );
    let plan_route: Module = ["doors", "http", "routes", "plan"].map(String::from).into();
    let plan_use_case: Module = ["core", "usecases", "plan"].map(String::from).into();
    assert!(
        by_file[&plan_route].contains(&plan_use_case),
        "the reader misses the plan route's use of the plan use case"
    );
    if let Err(why) = verdict(&by_file) {
        panic!("{why}");
    }
}

#[test]
fn a_tree_that_breaks_a_rule_is_refused() {
    let root = std::env::temp_dir().join(format!("airlock-layering-{}", std::process::id()));
    let write = |path: &str, text: &str| {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().expect("a folder")).expect("a folder");
        std::fs::write(p, text).expect("a file");
    };
    write("lib.rs", "pub mod core;\npub mod doors;\n");
    write("core/mod.rs", "pub mod domain;\npub mod usecases;\n");
    write("core/usecases.rs", "use crate::core::domain::Symbol;\n");
    write("core/domain.rs", "pub struct Symbol;\n");
    write("doors/mod.rs", "pub mod http;\n");
    write(
        "doors/http.rs",
        "use crate::core::{domain::Symbol, usecases};\n",
    );
    assert_eq!(verdict(&graph(&root)), Ok(()));

    // The domain reaching a door (inside a use tree, in code, not a comment).
    write(
        "core/domain.rs",
        "// crate::core::usecases is named here only in a comment\npub struct Symbol;\nfn f() { let _ = crate::doors::http::X; }\n",
    );
    let why = verdict(&graph(&root)).expect_err("the core reaches a door");
    assert!(why.contains("core::domain -> doors::http"), "{why}");

    // A cycle between two files of the core.
    write(
        "core/domain.rs",
        "pub struct Symbol;\nuse super::usecases::Y;\n",
    );
    let why = verdict(&graph(&root)).expect_err("a cycle");
    assert!(why.starts_with("a cycle of files"), "{why}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_reader_sees_use_trees_and_relative_paths() {
    let known: BTreeSet<Module> = [
        vec![],
        vec!["a".into()],
        vec!["a".into(), "b".into()],
        vec!["c".into()],
    ]
    .into_iter()
    .collect();
    let refs = references(
        &vec!["a".into(), "b".into()],
        "use crate::{c::X, a::{self, Y}};\nfn f() { super::Z; }",
        &known,
    );
    assert_eq!(
        refs,
        [vec!["a".to_string()], vec!["c".to_string()]]
            .into_iter()
            .collect()
    );
    assert!(broken_rule("core::domain", "core::usecases").is_some());
    assert!(broken_rule("core::usecases", "doors::http").is_some());
    assert!(broken_rule("doors::http", "core::usecases").is_none());
    let g: BTreeMap<u8, BTreeSet<u8>> = [(1, [2].into()), (2, [3].into()), (3, [1].into())]
        .into_iter()
        .collect();
    assert!(cycle(&g).is_some());
}
