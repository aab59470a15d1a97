//! The crate's layers hold: every `crate::module` a source file of `src/` names is allowed by
//! the layers table in docs/layout.md, the one place the rules live. Test code
//! (`#[cfg(test)]` modules and the files of test-only modules) is not held to them.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- layers: begin -->";
const END: &str = "<!-- layers: end -->";

/// The table: each module's layer, and the modules of its own or a higher layer it may use.
struct Rules {
    layer: BTreeMap<String, usize>,
    exceptions: BTreeSet<(String, String)>,
}

impl Rules {
    fn from_table(text: &str) -> Rules {
        let start = text
            .find(BEGIN)
            .expect("docs/layout.md has the layers table")
            + BEGIN.len();
        let end = text
            .find(END)
            .expect("docs/layout.md closes the layers table");
        let mut rules = Rules {
            layer: BTreeMap::new(),
            exceptions: BTreeSet::new(),
        };
        for row in text[start..end].lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let Ok(layer) = cells[0].parse::<usize>() else {
                continue; // the header and its rule
            };
            for module in backticked(cells[1]) {
                rules.layer.insert(module, layer);
            }
            // `user` → `used`, `used` (why)
            for exception in cells.get(2).unwrap_or(&"").split(')') {
                if let Some((user, used)) = exception.split_once('→') {
                    let user = backticked(user).pop().expect("a module before →");
                    for used in backticked(used.split('(').next().unwrap_or_default()) {
                        rules.exceptions.insert((user.clone(), used));
                    }
                }
            }
        }
        rules
    }

    /// Why `user` may not use `used`, or None when it may.
    fn forbids(&self, user: &str, used: &str) -> Option<String> {
        let (Some(&from), Some(&to)) = (self.layer.get(user), self.layer.get(used)) else {
            return None; // reported as a module missing from the table
        };
        let allowed = to < from || self.exceptions.contains(&(user.into(), used.into()));
        (!allowed).then(|| {
            format!(
                "`{user}` (layer {from}) may use only lower layers and its listed exceptions, \
                 not `{used}` (layer {to})"
            )
        })
    }
}

fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The module a source file belongs to: the first component under `src/`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("a file under src/");
    let first = relative.components().next().expect("a path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files and folders of modules declared `#[cfg(test)] mod name;`: test code throughout, the
/// folder's submodules too.
fn test_only_paths(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut test_only = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let Some(name) = pair[1]
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            if pair[0] == "#[cfg(test)]" {
                let dir = match file.file_name().and_then(|n| n.to_str()) {
                    Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_owned(),
                    _ => file.with_extension(""),
                };
                test_only.insert(dir.join(format!("{name}.rs")));
                test_only.insert(dir.join(name));
            }
        }
    }
    test_only
}

/// The `crate::` modules a line of code names, with `use crate::{a, b::c}` groups.
fn modules_named(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or_default();
    let mut named = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or_default();
            named.extend(inner.split(',').filter_map(|item| first_ident(item.trim())));
        } else if let Some(ident) = first_ident(rest) {
            named.push(ident);
        }
    }
    named
}

fn first_ident(text: &str) -> Option<String> {
    let ident: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!ident.is_empty()).then_some(ident)
}

/// Every violation in `root`'s `src/` against `rules`, as `file:line: what`.
fn violations(root: &Path, rules: &Rules) -> Vec<String> {
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let test_only = test_only_paths(&files);
    let mut found = Vec::new();
    let held_to_the_table = |file: &&PathBuf| !test_only.iter().any(|t| file.starts_with(t));
    for file in files.iter().filter(held_to_the_table) {
        let user = module_of(&src, file);
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        if !rules.layer.contains_key(&user) {
            found.push(format!(
                "{shown}: module `{user}` is not in the layers table"
            ));
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        let mut test_item = TestItem::default();
        for (number, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if test_item.skips(trimmed) || trimmed.starts_with("//") {
                continue;
            }
            for used in modules_named(line) {
                if used == user {
                    continue;
                }
                if !rules.layer.contains_key(&used) {
                    found.push(format!(
                        "{shown}:{}: `crate::{used}` is not in the layers table",
                        number + 1
                    ));
                } else if let Some(why) = rules.forbids(&user, &used) {
                    found.push(format!("{shown}:{}: {why}", number + 1));
                }
            }
        }
    }
    found
}

/// The item after a `#[cfg(test)]` (a test module, a test-only function or constant): test code,
/// which may use any layer. The rest of the file is read on after it.
#[derive(Default)]
struct TestItem {
    /// After the attribute, within the item.
    inside: bool,
    /// Braces open within the item.
    depth: i32,
    opened: bool,
}

impl TestItem {
    /// Whether `line` (trimmed) belongs to a test-only item.
    fn skips(&mut self, line: &str) -> bool {
        if !self.inside {
            if line.starts_with("#[cfg(test)]") {
                *self = Self {
                    inside: true,
                    ..Self::default()
                };
                return true;
            }
            return false;
        }
        if line.starts_with("#[") || line.starts_with("//") || line.is_empty() {
            return true;
        }
        for c in line.chars() {
            match c {
                '{' => (self.depth, self.opened) = (self.depth + 1, true),
                '}' => self.depth -= 1,
                _ => {}
            }
        }
        let ended = match self.opened {
            true => self.depth <= 0,
            false => line.ends_with(';'),
        };
        if ended {
            self.inside = false;
        }
        true
    }
}

#[test]
fn only_the_item_after_cfg_test_is_test_code() {
    let file = "#[cfg(test)]\nmod a;\nuse crate::x;\n#[cfg(test)]\npub(super) const fn f(\n) -> S {\n    S {}\n}\nuse crate::y;\n#[cfg(test)]\nmod tests {\n    use crate::z;\n}\n";
    let mut item = TestItem::default();
    let read: Vec<&str> = file
        .lines()
        .filter(|l| !item.skips(l.trim_start()))
        .collect();
    assert_eq!(read, ["use crate::x;", "use crate::y;"]);
}

fn readme_rules(root: &Path) -> Rules {
    Rules::from_table(
        &std::fs::read_to_string(root.join("docs/layout.md")).expect("read docs/layout.md"),
    )
}

#[test]
fn every_module_uses_only_what_the_layers_table_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = violations(root, &readme_rules(root));
    assert!(
        found.is_empty(),
        "{} use(s) break the layers table in docs/layout.md:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_table_is_read_as_written() {
    let rules = readme_rules(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert_eq!(rules.layer.get("cli"), Some(&8));
    assert_eq!(rules.layer.get("config"), Some(&2));
    assert!(rules.forbids("trainer", "cli").is_some());
    assert!(rules.forbids("buffer", "agent").is_some());
    assert!(rules.forbids("config", "ddp").is_some());
    assert!(
        rules.forbids("checkpoint", "learner").is_none(),
        "a listed exception"
    );
    assert!(
        rules.forbids("learner", "checkpoint").is_some(),
        "exceptions go one way"
    );
    assert!(rules.forbids("error", "cuda").is_none());
    assert_eq!(
        modules_named("use crate::{actor::Actor, config, ddp::RankInfo}; // crate::cli"),
        ["actor", "config", "ddp"]
    );
}

/// A use that breaks the table is found and named with its file and line.
#[test]
fn a_use_against_the_table_is_named() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("src/buffer")).unwrap();
    std::fs::write(
        root.path().join("src/buffer/mod.rs"),
        "//! crate::cli in a comment is fine\nuse crate::error::Result;\npub use crate::agent::Batch;\n\
         #[cfg(test)]\nmod tests { use crate::cli; }\n",
    )
    .unwrap();
    std::fs::write(root.path().join("src/extra.rs"), "").unwrap();
    let rules = readme_rules(Path::new(env!("CARGO_MANIFEST_DIR")));
    let found = violations(root.path(), &rules);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found
        .iter()
        .any(|f| f.starts_with("src/buffer/mod.rs:3: `buffer` (layer 1)")
            && f.contains("not `agent` (layer 4)")));
    assert!(found
        .iter()
        .any(|f| f.contains("src/extra.rs: module `extra` is not in the layers table")));
}
