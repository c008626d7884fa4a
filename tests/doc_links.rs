//! Every link in `src/docs/*.md` works in both places those files are read:
//! on GitHub, where the README's documentation table sends readers, and on
//! docs.rs, where `#![doc = include_str!(..)]` makes them module docs. So a
//! link is an absolute URL (a docs.rs URL for the crate's own items), or a
//! `#fragment` naming a heading of the same file. Rustdoc's own links
//! (`[settle](RateLimitLayer::settle)`, `` [`Fallback`] ``) resolve on
//! docs.rs only, and a fragment naming another file's heading resolves on
//! the page rustdoc builds from several files, not on GitHub.
//!
//! When `cargo doc --no-deps --all-features` has been run, every docs.rs URL
//! of this crate must also name a page it generated and an id on that page,
//! and every fragment an id of the page its file is part of. Without
//! `target/doc` only the form is checked.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Where the crate's own items are documented; what follows it is a path
/// under `target/doc/tollgate/`.
const DOCS_RS: &str = "https://docs.rs/tollgate/latest/tollgate/";

#[test]
fn every_link_in_src_docs_works_on_github_and_on_docs_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pages = pages_including_docs(&root.join("src"));
    let built = doc_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files(&root.join("src/docs")) {
        let name = file_name(&file);
        let text = fs::read_to_string(&file).unwrap();
        let page = pages.get(&name);
        if page.is_none() {
            problems.push(format!(
                "{name}: no `#![doc = include_str!(..)]` includes it, so docs.rs never shows it"
            ));
        }
        let headings = heading_slugs(&text);
        let definitions = definitions(&text);
        for link in links(&text) {
            checked += 1;
            let at = format!("src/docs/{name}:{}: [{}]", link.line, link.label);
            let target = match &link.target {
                Target::Url(url) => url.clone(),
                Target::Reference(label) => match definitions.get(&label.to_lowercase()) {
                    Some(url) => url.clone(),
                    None => {
                        problems.push(format!(
                            "{at}[{label}]: no `[{label}]: URL` definition in this file \
                             (rustdoc would read it as a path, GitHub as text)"
                        ));
                        continue;
                    }
                },
                Target::None => {
                    problems.push(format!(
                        "{at}: a rustdoc link without a URL, which GitHub shows as text; \
                         write [{}]({DOCS_RS}...) (or \\[ if it is no link)",
                        link.label
                    ));
                    continue;
                }
            };
            if let Err(problem) = check(&target, &headings, page, built.as_deref()) {
                problems.push(format!("{at}({target}): {problem}"));
            }
        }
    }
    // A parser that found nothing would prove nothing.
    assert!(checked > 100, "only {checked} links found in src/docs/*.md");
    assert!(
        problems.is_empty(),
        "{} link(s) in src/docs/*.md do not work on both GitHub and docs.rs{}:\n{}",
        problems.len(),
        if built.is_some() {
            " (if target/doc is stale, run `cargo doc --no-deps --all-features`)"
        } else {
            ""
        },
        problems.join("\n")
    );
}

/// Checks one link target of a file whose headings are `headings` and whose
/// rustdoc page is `page` (under `target/doc/tollgate/`).
fn check(
    target: &str,
    headings: &BTreeSet<String>,
    page: Option<&String>,
    built: Option<&Path>,
) -> Result<(), String> {
    if let Some(fragment) = target.strip_prefix('#') {
        if !headings.contains(fragment) {
            return Err(format!(
                "no heading of this file has the anchor #{fragment} (on GitHub a fragment \
                 names a heading of the same file; link another file's section by its \
                 docs.rs URL)"
            ));
        }
        return match (built, page) {
            (Some(doc), Some(page)) => has_id(&doc.join(page), fragment),
            _ => Ok(()),
        };
    }
    if let Some(rest) = target.strip_prefix(DOCS_RS) {
        let (path, fragment) = rest.split_once('#').unwrap_or((rest, ""));
        if !path.ends_with(".html") || path.split('/').any(|part| part == "..") {
            return Err(format!(
                "a docs.rs URL names a page: {DOCS_RS}module/struct.Name.html"
            ));
        }
        let Some(doc) = built else { return Ok(()) };
        let file = doc.join(path);
        if !file.is_file() {
            return Err(format!("rustdoc made no page {}", file.display()));
        }
        return if fragment.is_empty() {
            Ok(())
        } else {
            has_id(&file, fragment)
        };
    }
    if target.contains("docs.rs/tollgate") {
        return Err(format!("the crate's docs.rs URLs start with {DOCS_RS}"));
    }
    if target.starts_with("https://") || target.starts_with("http://") {
        return Ok(());
    }
    Err(
        "neither an absolute URL nor a #fragment: it resolves in rustdoc or on GitHub, \
         not in both"
            .to_owned(),
    )
}

fn has_id(page: &Path, id: &str) -> Result<(), String> {
    let html = fs::read_to_string(page).map_err(|e| format!("{}: {e}", page.display()))?;
    if html.contains(&format!("id=\"{id}\"")) {
        Ok(())
    } else {
        Err(format!("{} has no id {id:?}", page.display()))
    }
}

/// `target/doc/tollgate`, when `cargo doc` has made it.
fn doc_root() -> Option<PathBuf> {
    // The test runs as target/<profile>/deps/doc_links-<hash>, wherever
    // CARGO_TARGET_DIR puts target/.
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("doc")));
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/doc");
    from_exe
        .into_iter()
        .chain([beside])
        .map(|doc| doc.join("tollgate"))
        .find(|doc| doc.join("index.html").is_file())
}

/// Which rustdoc page (under `target/doc/tollgate/`) each `src/docs/NAME.md`
/// becomes part of, from the `#![doc = include_str!("../docs/NAME.md")]`
/// lines of `src/`.
fn pages_including_docs(src: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut pages = BTreeMap::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let module = file.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = module
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(parts.last().map(String::as_str), Some("lib" | "mod")) {
            parts.pop();
        }
        parts.push("index.html".to_owned());
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("#![doc = include_str!(\"") else {
                continue;
            };
            let Some(included) = rest.split('"').next() else {
                continue;
            };
            if let Some((_, name)) = included.rsplit_once("docs/") {
                pages.insert(name.to_owned(), parts.join("/"));
            }
        }
    }
    pages
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no markdown in {}", dir.display());
    files
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// One link: `[label](url)`, `[label][reference]`, or `[label]` alone (no
/// target: rustdoc resolves it as a path, GitHub shows it as text).
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    label: String,
    target: Target,
}

#[derive(Debug, PartialEq)]
enum Target {
    Url(String),
    Reference(String),
    None,
}

/// The markdown outside fenced code blocks, with those blocks' lines left
/// empty (so line numbers still count).
fn prose(text: &str) -> String {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push("");
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                out.push("");
            }
            (Some(_), _) => out.push(""),
            (None, None) => out.push(line),
        }
    }
    out.join("\n")
}

/// Every link of `text`, outside code blocks and code spans; link
/// definitions (`[label]: url` after a blank line) are not links.
fn links(text: &str) -> Vec<Link> {
    let prose = prose(text);
    let chars: Vec<char> = prose.chars().collect();
    let mut links = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '`' => i = past_code_span(&chars, i),
            '[' => {
                let Some(close) = closing_bracket(&chars, i) else {
                    i += 1;
                    continue;
                };
                let label: String = chars[i + 1..close].iter().collect();
                let line = 1 + chars[..i].iter().filter(|c| **c == '\n').count();
                let next = chars.get(close + 1).copied();
                let (target, end) = match next {
                    Some('(') => match closing(&chars, close + 1, '(', ')') {
                        Some(end) => {
                            let inside: String = chars[close + 2..end].iter().collect();
                            let url = inside.split_whitespace().next().unwrap_or("");
                            let url = url.trim_start_matches('<').trim_end_matches('>');
                            (Target::Url(url.to_owned()), end + 1)
                        }
                        None => (Target::None, close + 1),
                    },
                    Some('[') => match closing(&chars, close + 1, '[', ']') {
                        Some(end) => {
                            let reference: String = chars[close + 2..end].iter().collect();
                            let reference = if reference.is_empty() {
                                label.clone()
                            } else {
                                reference
                            };
                            (Target::Reference(reference), end + 1)
                        }
                        None => (Target::None, close + 1),
                    },
                    Some(':') if starts_block(&chars, i) => {
                        // A link definition: checked where it is used.
                        i = close + 1;
                        continue;
                    }
                    _ => (Target::None, close + 1),
                };
                links.push(Link {
                    line,
                    label,
                    target,
                });
                i = end;
            }
            _ => i += 1,
        }
    }
    links
}

/// `[label]: url` definitions (labels in lower case, as matched).
fn definitions(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut previous_blank = true;
    for line in prose(text).lines() {
        let trimmed = line.trim();
        if previous_blank
            && let Some(rest) = trimmed.strip_prefix('[')
            && let Some((label, url)) = rest.split_once("]:")
        {
            let url = url.split_whitespace().next().unwrap_or("");
            out.insert(label.to_lowercase(), url.to_owned());
        }
        previous_blank = trimmed.is_empty();
    }
    out
}

/// Whether the `[` at `i` starts a paragraph (where a definition can be):
/// only blanks before it on its line, and the line before it blank.
fn starts_block(chars: &[char], i: usize) -> bool {
    let text: String = chars[..i].iter().collect();
    let mut lines = text.rsplit('\n');
    let own = lines.next().unwrap_or("");
    own.trim().is_empty() && lines.next().is_none_or(|line| line.trim().is_empty())
}

/// The index after the code span that starts at `i` (or after its opening
/// backticks, when nothing closes it).
fn past_code_span(chars: &[char], i: usize) -> usize {
    let run = chars[i..].iter().take_while(|c| **c == '`').count();
    let mut j = i + run;
    while j < chars.len() {
        if chars[j] == '`' {
            let other = chars[j..].iter().take_while(|c| **c == '`').count();
            if other == run {
                return j + run;
            }
            j += other;
        } else {
            j += 1;
        }
    }
    i + run
}

/// The `]` that closes the `[` at `open`, skipping code spans and nested
/// brackets.
fn closing_bracket(chars: &[char], open: usize) -> Option<usize> {
    closing(chars, open, '[', ']')
}

fn closing(chars: &[char], open: usize, left: char, right: char) -> Option<usize> {
    let mut depth = 0;
    let mut j = open;
    while j < chars.len() {
        let c = chars[j];
        if c == '\\' {
            j += 2;
            continue;
        }
        if c == '`' && left == '[' {
            j = past_code_span(chars, j);
            continue;
        }
        if c == left {
            depth += 1;
        } else if c == right {
            depth -= 1;
            if depth == 0 {
                return Some(j);
            }
        }
        j += 1;
    }
    None
}

/// The anchors GitHub gives the headings of `text`: lower case, spaces to
/// `-`, punctuation other than `-` and `_` dropped (rustdoc's ids agree for
/// these files; a fragment must name one of both).
fn heading_slugs(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter_map(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            let rest = line.get(hashes..)?;
            ((1..=6).contains(&hashes) && rest.starts_with(' ')).then(|| slug(rest))
        })
        .collect()
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .trim_end_matches('#')
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn the_parser_finds_links_where_markdown_has_them() {
    let text = "\
# A heading (`code`)

See [`settle`](crate::layer::RateLimitLayer::settle) and [`Fallback`],
[a section](#a-heading-code), [the docs][docs] and `[not a link]`, \\[nor this].
A [link
across lines](https://example.com/x_(y)).

```rust
let a = [1, 2]; // [`Ignored`]
```

[docs]: https://docs.rs/tollgate/latest/tollgate/index.html
";
    let found: Vec<(usize, String, Target)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.label, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (
                3,
                "`settle`".to_owned(),
                Target::Url("crate::layer::RateLimitLayer::settle".to_owned())
            ),
            (3, "`Fallback`".to_owned(), Target::None),
            (
                4,
                "a section".to_owned(),
                Target::Url("#a-heading-code".to_owned())
            ),
            (
                4,
                "the docs".to_owned(),
                Target::Reference("docs".to_owned())
            ),
            (
                5,
                "link\nacross lines".to_owned(),
                Target::Url("https://example.com/x_(y)".to_owned())
            ),
        ]
    );
    assert!(heading_slugs(text).contains("a-heading-code"));
    assert_eq!(
        definitions(text).get("docs").map(String::as_str),
        Some("https://docs.rs/tollgate/latest/tollgate/index.html")
    );
    let headings = heading_slugs(text);
    let works = |target: &str| check(target, &headings, None, None).is_ok();
    assert!(!works("crate::Fallback"));
    assert!(!works("#elsewhere"));
    assert!(works("#a-heading-code"));
    assert!(works(&format!("{DOCS_RS}struct.Fallback.html")));
    assert!(!works("https://docs.rs/tollgate/0.1.0/tollgate/"));
}
