//! The crate's layout rule: no file of `src/` imports, directly or through
//! other files, a file that imports it. Each module is a one-way stack (as
//! tower-http's `cors/` and tower's `limit/concurrency/` are), so a change to
//! gRPC rendering cannot ripple into HTTP rendering and back.
//!
//! Every `crate::`, `super::` and `self::` path, and every `use` of a child
//! module, is resolved to the file that defines the item, following the
//! re-exports of `lib.rs` and `mod.rs` files. A file's `#[cfg(test)] mod`
//! blocks are left out: tests may look at anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// One source file: its module path and what it says.
struct Module {
    file: PathBuf,
    path: Vec<String>,
    /// Names brought into scope by `use` (alias -> full path, as written).
    uses: Vec<(String, Vec<String>)>,
    /// Child modules declared with `mod x;`.
    children: BTreeSet<String>,
    /// Every path the file refers to (from `use` and from code).
    refs: Vec<Vec<String>>,
}

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = load(&root);
    let by_path: BTreeMap<Vec<String>, usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.clone(), i))
        .collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, m) in modules.iter().enumerate() {
        for r in &m.refs {
            if let Some(target) = resolve(&modules, &by_path, i, r, 0)
                && target != i
            {
                edges.entry(i).or_default().insert(target);
            }
        }
    }
    // The parser must see the real imports, or the check proves nothing.
    let names = |i: &usize| modules[*i].file.display().to_string();
    let check_rs = modules
        .iter()
        .position(|m| m.file.ends_with("layer/check.rs"));
    let outcome = modules
        .iter()
        .position(|m| m.file.ends_with("layer/outcome.rs"));
    let (Some(check_rs), Some(outcome)) = (check_rs, outcome) else {
        panic!("src/layer/check.rs or outcome.rs not found");
    };
    assert!(
        edges.get(&check_rs).is_some_and(|e| e.contains(&outcome)),
        "the parser did not see check.rs importing outcome.rs: {:?}",
        edges
            .get(&check_rs)
            .map(|e| e.iter().map(names).collect::<Vec<_>>())
    );
    if let Some(cycle) = find_cycle(&edges) {
        let files: Vec<String> = cycle.iter().map(names).collect();
        panic!("import cycle: {}", files.join(" -> "));
    }
}

fn load(root: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    collect(root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(root).unwrap().with_extension("");
            let mut path: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path.last().is_some_and(|l| l == "mod" || l == "lib") {
                path.pop();
            }
            let text = code_only(&fs::read_to_string(&file).unwrap());
            // Paths inside `mod x { ... }` are relative to x, which this
            // checker does not track: such modules belong in files of their own.
            assert!(
                !has_inline_module(&text),
                "{}: an inline module outside tests; move it to a file of its own",
                file.display()
            );
            parse(file, path, &text)
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file without comments, string and char literals, and test modules.
fn code_only(src: &str) -> String {
    let bytes = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let open = rest.find('"').unwrap();
            let hashes = &rest[1..open];
            let close = format!("\"{hashes}");
            i += open + 1 + rest[open + 1..].find(&close).unwrap() + close.len();
            out.push_str("\"\"");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            i += j + 1;
            out.push_str("\"\"");
        } else if rest.starts_with("'\\") || (rest.len() > 2 && rest.as_bytes()[2] == b'\'') {
            // A char literal ('x', '\n', '\''); lifetimes ('a) are left alone.
            let end = rest[1..].find('\'').map_or(1, |e| e + 2);
            i += end;
            out.push_str("' '");
        } else {
            let ch = rest.chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    // Test modules come last in a file, after `#[cfg(test)]` and `mod`.
    let mut code = out;
    while let Some(at) = find_test_module(&code) {
        code.truncate(at);
    }
    code
}

fn has_inline_module(code: &str) -> bool {
    code.split_inclusive(['{', ';']).any(|statement| {
        let words: Vec<&str> = statement.split_whitespace().collect();
        words
            .windows(3)
            .any(|w| w[0] == "mod" && is_ident(w[1]) && w[2] == "{")
            || words.windows(2).any(|w| {
                w[0] == "mod" && w[1].ends_with('{') && is_ident(w[1].trim_end_matches('{'))
            })
    })
}

fn find_test_module(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let start = from + at;
        let after = code[start + "#[cfg(test)]".len()..].trim_start();
        if after.starts_with("mod ") || after.starts_with("pub(crate) mod ") {
            return Some(start);
        }
        from = start + 1;
    }
    None
}

fn parse(file: PathBuf, path: Vec<String>, text: &str) -> Module {
    let mut uses = Vec::new();
    let mut refs = Vec::new();
    let mut children = BTreeSet::new();
    let mut rest = String::new();
    for statement in text.split_inclusive(';') {
        let trimmed = strip_attributes(statement.trim());
        let body = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ");
        if let Some(tree) = body.strip_prefix("use ") {
            for (alias, full) in expand(tree.trim_end_matches(';').trim()) {
                refs.push(full.clone());
                uses.push((alias, full));
            }
        } else if let Some(name) = body.strip_prefix("mod ") {
            let name = name.trim_end_matches(';').trim();
            if is_ident(name) {
                children.insert(name.to_owned());
            }
            rest.push_str(statement);
        } else {
            rest.push_str(statement);
        }
    }
    // Inline paths in code: crate::a::b, super::x, self::y.
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = rest[from..].find(start) {
            let begin = from + at;
            let boundary = begin == 0
                || !rest.as_bytes()[begin - 1].is_ascii_alphanumeric()
                    && rest.as_bytes()[begin - 1] != b'_'
                    && rest.as_bytes()[begin - 1] != b':';
            let end = rest[begin..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(rest.len(), |e| begin + e);
            if boundary {
                let segments: Vec<String> = rest[begin..end]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                refs.push(segments);
            }
            from = end.max(begin + 1);
        }
    }
    Module {
        file,
        path,
        uses,
        children,
        refs,
    }
}

/// A statement without the `#[...]` attributes in front of it.
fn strip_attributes(mut s: &str) -> &str {
    while s.starts_with("#[") || s.starts_with("#![") {
        let mut depth = 0;
        let mut end = s.len();
        for (i, c) in s.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        s = s[end..].trim_start();
    }
    s
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `a::{b, c::{d as e}}` -> [(b, a::b), (e, a::c::d)].
fn expand(tree: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    expand_into(&[], tree, &mut out);
    out
}

fn expand_into(prefix: &[String], tree: &str, out: &mut Vec<(String, Vec<String>)>) {
    let tree = tree.trim();
    let segments = |p: &str| -> Vec<String> {
        p.split("::")
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    if let Some(open) = tree.find('{') {
        let mut full = prefix.to_vec();
        full.extend(segments(&tree[..open]));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        for part in split_top(inner) {
            expand_into(&full, &part, out);
        }
        return;
    }
    let words: Vec<&str> = tree.split_whitespace().collect();
    let (path, alias) = match words.as_slice() {
        [path, "as", alias] => (*path, Some((*alias).to_owned())),
        _ => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(segments(path));
    if full.last().is_some_and(|l| l == "self") {
        full.pop();
    }
    let Some(last) = full.last().cloned() else {
        return;
    };
    out.push((alias.unwrap_or(last), full));
}

/// Splits `a, b::{c, d}, e` at top-level commas.
fn split_top(s: &str) -> Vec<String> {
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    parts
}

/// The file that defines what `path`, written in module `from`, names; `None`
/// for paths outside the crate.
fn resolve(
    modules: &[Module],
    by_path: &BTreeMap<Vec<String>, usize>,
    from: usize,
    path: &[String],
    depth: usize,
) -> Option<usize> {
    if depth > 16 || path.is_empty() {
        return None;
    }
    let mut module = modules[from].path.clone();
    let mut segments = path;
    // The start of the path: crate, super, self, or a child module in scope.
    match segments[0].as_str() {
        "crate" => {
            module.clear();
            segments = &segments[1..];
        }
        "self" => segments = &segments[1..],
        "super" => {
            while segments.first().is_some_and(|s| s == "super") {
                module.pop();
                segments = &segments[1..];
            }
        }
        first if modules[from].children.contains(first) => {}
        first => {
            // A name this module imported (`use x::Y;` then `Y::z`).
            let (_, full) = modules[from]
                .uses
                .iter()
                .find(|(alias, full)| alias == first && full.first() != Some(&first.to_owned()))?;
            let mut again = full.clone();
            again.extend(segments[1..].iter().cloned());
            return resolve(modules, by_path, from, &again, depth + 1);
        }
    }
    let mut at = *by_path.get(&module)?;
    for (i, segment) in segments.iter().enumerate() {
        let mut child = module.clone();
        child.push(segment.clone());
        if modules[at].children.contains(segment)
            && let Some(&next) = by_path.get(&child)
        {
            module = child;
            at = next;
            continue;
        }
        // An item: defined here, or re-exported from elsewhere.
        if segment == "*" {
            return Some(at);
        }
        if let Some((_, full)) = modules[at].uses.iter().find(|(alias, _)| alias == segment) {
            let mut again = full.clone();
            again.extend(segments[i + 1..].iter().cloned());
            return resolve(modules, by_path, at, &again, depth + 1).or(Some(at));
        }
        return Some(at);
    }
    Some(at)
}

/// A cycle in the graph, if any, as the files along it.
fn find_cycle(edges: &BTreeMap<usize, BTreeSet<usize>>) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        n: usize,
        edges: &BTreeMap<usize, BTreeSet<usize>>,
        marks: &mut BTreeMap<usize, Mark>,
        stack: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        marks.insert(n, Mark::Open);
        stack.push(n);
        for &m in edges.get(&n).into_iter().flatten() {
            match marks.get(&m) {
                Some(Mark::Open) => {
                    let start = stack.iter().position(|&x| x == m).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(m);
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(c) = visit(m, edges, marks, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(n, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for &n in edges.keys() {
        if !marks.contains_key(&n)
            && let Some(c) = visit(n, edges, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// The checker itself finds a cycle when there is one.
#[test]
fn the_checker_finds_a_planted_cycle() {
    let dir = std::env::temp_dir().join(format!("tollgate-layout-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("layer")).unwrap();
    fs::write(dir.join("lib.rs"), "mod layer;\npub use layer::A;\n").unwrap();
    fs::write(
        dir.join("layer/mod.rs"),
        "mod a;\nmod b;\npub use a::A;\npub use b::{B as Bee};\n",
    )
    .unwrap();
    fs::write(
        dir.join("layer/a.rs"),
        "use super::Bee;\n// use super::nothing;\npub struct A(Bee);\n",
    )
    .unwrap();
    fs::write(
        dir.join("layer/b.rs"),
        "pub struct B;\nfn f() -> crate::A { todo!() }\n#[cfg(test)]\nmod tests { use super::super::a::A; }\n",
    )
    .unwrap();
    let modules = load(&dir);
    let by_path: BTreeMap<Vec<String>, usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.clone(), i))
        .collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, m) in modules.iter().enumerate() {
        for r in &m.refs {
            if let Some(t) = resolve(&modules, &by_path, i, r, 0)
                && t != i
            {
                edges.entry(i).or_default().insert(t);
            }
        }
    }
    let cycle = find_cycle(&edges).expect("a.rs -> b.rs -> a.rs");
    let files: Vec<String> = cycle
        .iter()
        .map(|i| {
            modules[*i]
                .file
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        files.contains(&"a.rs".to_owned()) && files.contains(&"b.rs".to_owned()),
        "{files:?}"
    );
    let _ = fs::remove_dir_all(&dir);
}
