//! `cargo xtask tidy`: fails when the docs drift from the code, as rust-analyzer's `xtask/src/tidy.rs` does.
//!
//! Two rules:
//! - **The drawn dependencies are the real ones.** The fenced block under `## Crate dependencies` in
//!   `ARCHITECTURE.md` has one line `crate -> dep, dep` per workspace member. Every dependency drawn there must
//!   be a normal dependency in that crate's `Cargo.toml` (optional ones marked `(optional)`), and every normal
//!   dependency on another workspace member must be drawn. External crates may be drawn (sdpa-candle's
//!   candle-core); they are checked only for existence. Dev- and build-dependencies are not drawn.
//! - **Every module says what it is for.** Each `.rs` file under a member's `src/` starts (after blank lines)
//!   with a `//!` doc.
//!
//! `Cargo.toml` is read by a small line parser of the dependency tables, not a TOML library: it handles the
//! forms the workspace uses (`name = "1"`, `name.workspace = true`, inline tables, `[dependencies.name]`
//! tables, `[target.'cfg(..)'.dependencies]`, `package = "..."` renames).

use crate::project_root;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The heading whose first fenced block holds the dependency lines.
const DEPS_HEADING: &str = "## Crate dependencies";
/// The marker after a drawn dependency that `Cargo.toml` declares `optional = true`.
const OPTIONAL_MARK: &str = "(optional)";

const HELP: &str = "\
cargo xtask tidy

Fails when a crate dependency drawn in ARCHITECTURE.md (`## Crate dependencies`) is not in that crate's
Cargo.toml, when an intra-workspace dependency is not drawn, or when a module under a crate's src/ lacks a
`//!` doc at its top.
";

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        if matches!(a.as_str(), "-h" | "--help" | "help") {
            print!("{HELP}");
            return Ok(());
        }
        bail!("tidy takes no arguments, got `{a}`\n{HELP}");
    }
    let root = project_root();
    let crates = workspace_crates(&root)?;
    let arch_path = root.join("ARCHITECTURE.md");
    let arch = fs::read_to_string(&arch_path).with_context(|| format!("reading {}", arch_path.display()))?;

    let mut problems = match parse_drawn(&arch) {
        Ok(drawn) => check_deps(&drawn, &crates),
        Err(e) => vec![format!("ARCHITECTURE.md: {e:#}")],
    };
    let mut modules = 0;
    for c in &crates {
        let files = rust_files(&c.dir.join("src"))?;
        modules += files.len();
        for f in files {
            let text = fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            if !has_module_doc(&text) {
                let shown = f.strip_prefix(&root).unwrap_or(&f);
                problems.push(format!("{}: no `//!` doc at the top of the module", shown.display()));
            }
        }
    }
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("tidy: {p}");
        }
        bail!("tidy: {} problem(s) (the rules: `cargo xtask tidy --help`)", problems.len());
    }
    println!("tidy: {} crates, {modules} modules: dependencies as drawn, every module documented", crates.len());
    Ok(())
}

/// One dependency of a crate as its `Cargo.toml` declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dep {
    /// The crate depended on (the `package = ".."` name when the key renames it).
    name: String,
    optional: bool,
}

/// A workspace member: its package name, directory and normal dependencies.
#[derive(Debug)]
struct Crate {
    name: String,
    dir: PathBuf,
    deps: Vec<Dep>,
}

/// The members listed in the root `Cargo.toml`, each with its parsed manifest.
fn workspace_crates(root: &Path) -> Result<Vec<Crate>> {
    let root_toml = root.join("Cargo.toml");
    let text = fs::read_to_string(&root_toml).with_context(|| format!("reading {}", root_toml.display()))?;
    let members = parse_members(&text).context("root Cargo.toml: no `members = [...]` in [workspace]")?;
    let mut crates = Vec::new();
    for m in members {
        let dir = root.join(&m);
        let path = dir.join("Cargo.toml");
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let manifest = parse_manifest(&text);
        let name = manifest.name.with_context(|| format!("{}: no `name` in [package]", path.display()))?;
        crates.push(Crate { name, dir, deps: manifest.deps });
    }
    Ok(crates)
}

/// The quoted entries of `members = [ ... ]` in `[workspace]`, which may span lines.
fn parse_members(text: &str) -> Option<Vec<String>> {
    let mut in_workspace = false;
    let mut collecting: Option<String> = None;
    for raw in text.lines() {
        let line = strip_comment(raw).trim();
        if let Some(buf) = collecting.as_mut() {
            buf.push_str(line);
            buf.push(' ');
        } else if let Some(header) = table_header(line) {
            in_workspace = header == "workspace";
            continue;
        } else if in_workspace {
            if let Some((key, value)) = line.split_once('=') {
                if key.trim() == "members" {
                    collecting = Some(value.trim().to_string());
                }
            }
        }
        if let Some(buf) = &collecting {
            if buf.contains(']') {
                let inner = buf.trim().trim_start_matches('[');
                let inner = &inner[..inner.find(']').unwrap_or(inner.len())];
                return Some(split_top_level(inner).iter().map(|s| unquote(s)).filter(|s| !s.is_empty()).collect());
            }
        }
    }
    None
}

/// What tidy needs from a member's `Cargo.toml`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Manifest {
    name: Option<String>,
    /// Normal dependencies (`[dependencies]` and `[target.*.dependencies]`), in order of first mention.
    deps: Vec<Dep>,
}

/// Which table a line of `Cargo.toml` sits in, as far as tidy cares.
enum Table {
    Package,
    /// `[dependencies]` or `[target.X.dependencies]`: each key is a dependency.
    Deps,
    /// `[dependencies.NAME]`: each key is a field of dependency NAME.
    Dep(String),
    Other,
}

fn parse_manifest(text: &str) -> Manifest {
    let mut name = None;
    // Keyed by the manifest key (the local name); the value holds the real crate name and optional flag.
    let mut deps: Vec<(String, Dep)> = Vec::new();
    let mut table = Table::Other;
    for raw in text.lines() {
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if let Some(header) = table_header(line) {
            let path: Vec<String> = split_dotted(header);
            let deps_at = |i: usize| path.get(i).is_some_and(|p| p == "dependencies");
            table = match path.as_slice() {
                [p] if p == "package" => Table::Package,
                [_] if deps_at(0) => Table::Deps,
                [_, n] if deps_at(0) => Table::Dep(n.clone()),
                [t, _, _] if t == "target" && deps_at(2) => Table::Deps,
                [t, _, _, n] if t == "target" && deps_at(2) => Table::Dep(n.clone()),
                _ => Table::Other,
            };
            if let Table::Dep(n) = &table {
                entry(&mut deps, n);
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let key_path = split_dotted(key.trim());
        let value = value.trim();
        match &table {
            Table::Package => {
                if key_path.len() == 1 && key_path[0] == "name" {
                    name = Some(unquote(value));
                }
            }
            Table::Deps => {
                let Some(dep_key) = key_path.first() else { continue };
                let dep = entry(&mut deps, dep_key);
                match key_path.get(1).map(String::as_str) {
                    // `name.optional = true`, `name.package = "real"`
                    Some(field) => apply_field(dep, field, value),
                    // `name = { .. }` (or a version string, which sets nothing)
                    None => {
                        if let Some(inner) = value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
                            for part in split_top_level(inner) {
                                if let Some((k, v)) = part.split_once('=') {
                                    apply_field(dep, k.trim(), v.trim());
                                }
                            }
                        }
                    }
                }
            }
            Table::Dep(n) => {
                if key_path.len() == 1 {
                    let n = n.clone();
                    apply_field(entry(&mut deps, &n), &key_path[0], value);
                }
            }
            Table::Other => {}
        }
    }
    Manifest { name, deps: deps.into_iter().map(|(_, d)| d).collect() }
}

/// The dependency under manifest key `key`, added (not optional, not renamed) on first mention.
fn entry<'a>(deps: &'a mut Vec<(String, Dep)>, key: &str) -> &'a mut Dep {
    let i = match deps.iter().position(|(k, _)| k == key) {
        Some(i) => i,
        None => {
            deps.push((key.to_string(), Dep { name: key.to_string(), optional: false }));
            deps.len() - 1
        }
    };
    &mut deps[i].1
}

fn apply_field(dep: &mut Dep, field: &str, value: &str) {
    match field {
        "optional" => dep.optional = value == "true",
        "package" => dep.name = unquote(value),
        _ => {}
    }
}

/// `[a.b]` -> `a.b`; `[[bench]]` and other lines -> None (array tables hold no dependencies).
fn table_header(line: &str) -> Option<&str> {
    if line.starts_with("[[") {
        return Some("");
    }
    line.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// `target.'cfg(unix)'.dependencies` -> [target, cfg(unix), dependencies]: dots inside quotes stay.
fn split_dotted(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for ch in s.chars() {
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(ch),
        }
    }
    parts.push(cur.trim().to_string());
    parts
}

/// Splits on commas outside strings, brackets and braces (`features = ["a", "b"]` stays one part).
fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut quote = None;
    for ch in s.chars() {
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        parts.push(cur.trim().to_string());
    }
    parts
}

/// The line without a `#` comment (a `#` inside a string is kept).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, ch) in line.char_indices() {
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches(|c| c == '"' || c == '\'').to_string()
}

/// One line of the drawn block: a crate and what it depends on.
#[derive(Debug, PartialEq, Eq)]
struct Drawn {
    krate: String,
    deps: Vec<Dep>,
}

/// The lines of the first fenced block under [`DEPS_HEADING`].
fn parse_drawn(markdown: &str) -> Result<Vec<Drawn>> {
    let mut lines = markdown.lines().skip_while(|l| l.trim_end() != DEPS_HEADING);
    if lines.next().is_none() {
        bail!("no `{DEPS_HEADING}` section");
    }
    let mut fenced = false;
    for l in lines.by_ref() {
        if l.starts_with("## ") {
            break;
        }
        if l.trim_start().starts_with("```") {
            fenced = true;
            break;
        }
    }
    if !fenced {
        bail!("no fenced block under `{DEPS_HEADING}`");
    }
    let mut drawn: Vec<Drawn> = Vec::new();
    let mut closed = false;
    for l in lines {
        let l = l.trim();
        if l.starts_with("```") {
            closed = true;
            break;
        }
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let Some((krate, rest)) = l.split_once("->") else {
            bail!("`{l}`: expected `crate -> dep, dep`");
        };
        let krate = krate.trim().to_string();
        if krate.is_empty() {
            bail!("`{l}`: no crate before `->`");
        }
        if drawn.iter().any(|d| d.krate == krate) {
            bail!("`{krate}` has two lines");
        }
        let mut deps = Vec::new();
        for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, optional) = match part.strip_suffix(OPTIONAL_MARK) {
                Some(n) => (n.trim(), true),
                None => (part, false),
            };
            if name.is_empty() || name.contains(char::is_whitespace) {
                bail!("`{l}`: `{part}` is not a crate name (optionally followed by `{OPTIONAL_MARK}`)");
            }
            deps.push(Dep { name: name.to_string(), optional });
        }
        drawn.push(Drawn { krate, deps });
    }
    if !closed {
        bail!("the fenced block under `{DEPS_HEADING}` is not closed");
    }
    Ok(drawn)
}

/// Everything on which the drawing and the manifests disagree, one line each.
fn check_deps(drawn: &[Drawn], crates: &[Crate]) -> Vec<String> {
    let members: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    let by_name: BTreeMap<&str, &Drawn> = drawn.iter().map(|d| (d.krate.as_str(), d)).collect();
    let mut problems = Vec::new();
    for d in drawn {
        if !members.contains(d.krate.as_str()) {
            problems.push(format!("`{}` is drawn but is not a workspace member", d.krate));
        }
    }
    for c in crates {
        let Some(d) = by_name.get(c.name.as_str()) else {
            problems.push(format!("`{}` has no line `{} -> ...` under `{DEPS_HEADING}`", c.name, c.name));
            continue;
        };
        for want in &d.deps {
            match c.deps.iter().find(|have| have.name == want.name) {
                None => problems.push(format!(
                    "`{} -> {}` is drawn, but {}/Cargo.toml has no such normal dependency",
                    c.name,
                    want.name,
                    c.dir.file_name().map_or_else(|| c.name.clone(), |f| f.to_string_lossy().into_owned()),
                )),
                Some(have) if have.optional != want.optional => problems.push(format!(
                    "`{} -> {}`: Cargo.toml says optional = {}, the drawing {} {}",
                    c.name,
                    want.name,
                    have.optional,
                    if want.optional { "marks it" } else { "does not mark it" },
                    OPTIONAL_MARK,
                )),
                Some(_) => {}
            }
        }
        for have in &c.deps {
            if members.contains(have.name.as_str()) && !d.deps.iter().any(|w| w.name == have.name) {
                let mark = if have.optional { format!(" {OPTIONAL_MARK}") } else { String::new() };
                problems.push(format!(
                    "`{}` depends on `{}` in Cargo.toml, but the drawing does not say so (add `{}{mark}`)",
                    c.name, have.name, have.name
                ));
            }
        }
    }
    problems
}

/// True when the first non-blank line is a `//!` inner doc comment.
fn has_module_doc(text: &str) -> bool {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_start().starts_with("//!"))
}

/// Every `.rs` file under `dir`, recursively, sorted; none when `dir` does not exist.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(name: &str, optional: bool) -> Dep {
        Dep { name: name.into(), optional }
    }

    fn krate(name: &str, deps: &[(&str, bool)]) -> Crate {
        Crate { name: name.into(), dir: PathBuf::from(name), deps: deps.iter().map(|&(n, o)| dep(n, o)).collect() }
    }

    fn drawn(krate: &str, deps: &[(&str, bool)]) -> Drawn {
        Drawn { krate: krate.into(), deps: deps.iter().map(|&(n, o)| dep(n, o)).collect() }
    }

    #[test]
    fn manifest_forms_the_workspace_uses() {
        let m = parse_manifest(
            r#"
[package]
name = "sdpa-candle"  # trailing comment
description = "a = b, [not a table]"
version.workspace = true

[features]
cuda = ["candle-core/cuda", "dep:sdpa-cuda"]

[dependencies]
sdpa-core.workspace = true
sdpa-cuda = { workspace = true, optional = true }
half = { version = "2", features = ["std", "num-traits"], optional = false }
serde = "1"
# sdpa-analysis.workspace = true
renamed = { package = "sdpa-cpu", path = "../sdpa-cpu" }
later.workspace = true
later.optional = true

[dev-dependencies]
sdpa-analysis.workspace = true

[build-dependencies]
cc = "1"

[dependencies.tabled]
path = "../tabled"
optional = true

[target.'cfg(unix)'.dependencies]
libc = "0.2"

[target."cfg(windows)".dependencies.winapi]
version = "0.3"

[[bench]]
name = "cpu"
"#,
        );
        assert_eq!(m.name.as_deref(), Some("sdpa-candle"));
        assert_eq!(
            m.deps,
            vec![
                dep("sdpa-core", false),
                dep("sdpa-cuda", true),
                dep("half", false),
                dep("serde", false),
                dep("sdpa-cpu", false),
                dep("later", true),
                dep("tabled", true),
                dep("libc", false),
                dep("winapi", false),
            ]
        );
    }

    #[test]
    fn members_span_lines_and_skip_comments() {
        let text = r#"
[workspace]
resolver = "2"
members = [
    "sdpa-core",
    # "old-crate",
    "xtask", # chores
]
default-members = ["sdpa-core"]

[workspace.dependencies]
members = ["not-this"]
"#;
        assert_eq!(parse_members(text), Some(vec!["sdpa-core".to_string(), "xtask".to_string()]));
        assert_eq!(parse_members("[workspace]\nmembers = [\"a\", \"b\"]\n"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(parse_members("[package]\nname = \"x\"\n"), None);
    }

    #[test]
    fn drawn_block_is_read_from_its_section() {
        let md = "# Architecture\n\n```\nnot -> this\n```\n\n## Crate dependencies\n\nSome prose.\n\n```text\n\
                  # a comment\nsdpa-core ->\nsdpa-candle -> sdpa-core, sdpa-cuda (optional), candle-core\n\n```\n\n\
                  ## Code map\n";
        assert_eq!(
            parse_drawn(md).unwrap(),
            vec![
                drawn("sdpa-core", &[]),
                drawn("sdpa-candle", &[("sdpa-core", false), ("sdpa-cuda", true), ("candle-core", false)]),
            ]
        );
    }

    #[test]
    fn drawn_block_errors_say_what_is_wrong() {
        let err = |md: &str| format!("{:#}", parse_drawn(md).unwrap_err());
        assert!(err("# Architecture\n").contains("no `## Crate dependencies` section"));
        assert!(err("## Crate dependencies\n\ntext\n\n## Code map\n```\na -> b\n```\n").contains("no fenced block"));
        assert!(err("## Crate dependencies\n```\na -> b\n").contains("not closed"));
        assert!(err("## Crate dependencies\n```\na, b\n```\n").contains("expected `crate -> dep, dep`"));
        assert!(err("## Crate dependencies\n```\na -> b\na -> c\n```\n").contains("`a` has two lines"));
        assert!(err("## Crate dependencies\n```\na -> b c\n```\n").contains("not a crate name"));
        assert!(err("## Crate dependencies\n```\n -> b\n```\n").contains("no crate before"));
    }

    #[test]
    fn deps_as_drawn_pass() {
        let crates = [
            krate("core", &[("serde", false)]),
            krate("cpu", &[("core", false), ("rayon", false)]),
            krate("candle", &[("core", false), ("cpu", true), ("candle-core", false)]),
        ];
        let lines = [
            drawn("core", &[]),
            drawn("cpu", &[("core", false)]),
            drawn("candle", &[("core", false), ("cpu", true), ("candle-core", false)]),
        ];
        assert_eq!(check_deps(&lines, &crates), Vec::<String>::new());
    }

    #[test]
    fn deps_that_drift_are_named() {
        let crates = [
            krate("core", &[]),
            krate("cpu", &[("core", false)]),
            krate("cli", &[("core", false), ("cpu", true)]),
            krate("xtask", &[]),
        ];
        let lines = [
            drawn("core", &[]),
            // drawn but absent: an intra-workspace edge and an external crate
            drawn("cpu", &[("core", false), ("cli", false), ("candle-core", false)]),
            // `cpu` missing from the drawing; `core` wrongly marked optional
            drawn("cli", &[("core", true)]),
            drawn("ghost", &[]),
        ];
        let problems = check_deps(&lines, &crates);
        let expect = [
            "`ghost` is drawn but is not a workspace member",
            "`cpu -> cli` is drawn, but cpu/Cargo.toml has no such normal dependency",
            "`cpu -> candle-core` is drawn, but cpu/Cargo.toml has no such normal dependency",
            "`cli -> core`: Cargo.toml says optional = false, the drawing marks it (optional)",
            "`cli` depends on `cpu` in Cargo.toml, but the drawing does not say so (add `cpu (optional)`)",
            "`xtask` has no line `xtask -> ...` under `## Crate dependencies`",
        ];
        assert_eq!(problems, expect, "{problems:#?}");
    }

    #[test]
    fn module_doc_must_come_first() {
        assert!(has_module_doc("//! The spec.\n\nuse x;\n"));
        assert!(has_module_doc("\n\n//! After blank lines.\n"));
        assert!(has_module_doc("\u{feff}//! After a byte-order mark.\n"));
        assert!(!has_module_doc("use x;\n//! Too late.\n"));
        assert!(!has_module_doc("// A plain comment.\n//! Too late.\n"));
        assert!(!has_module_doc("/// An item doc, not a module doc.\nfn f() {}\n"));
        assert!(!has_module_doc("#![allow(dead_code)]\n//! After an attribute.\n"));
        assert!(!has_module_doc(""));
    }

    #[test]
    fn comments_and_strings() {
        assert_eq!(strip_comment(r#"a = "x # y" # z"#), r#"a = "x # y" "#);
        assert_eq!(split_dotted("target.'cfg(target_os = \"linux\")'.dependencies").len(), 3);
        assert_eq!(split_top_level(r#"a = 1, b = ["x", "y"], c = { d = 2, e = 3 }"#).len(), 3);
        assert_eq!(table_header("[[bench]]"), Some(""));
        assert_eq!(table_header("name = 1"), None);
    }

    /// The real tree passes, so `cargo test --workspace` catches drift even where `cargo xtask tidy` is not run.
    #[test]
    fn the_tree_is_tidy() {
        run(&[]).unwrap();
    }
}
